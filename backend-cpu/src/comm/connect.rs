//! How a CPU-backend rank connects to its peers ([`Comm::connect`]): what each rank says
//! of its machine, the transport chosen for every pair, the links made, and what the
//! communicator learns from them (the ring in memory, the caches, the nodes); and, at
//! its end, how many channels and connections it made ([`ChannelReport`]).

use super::{Comm, debug_info};
use crate::error::SharedError;
use crate::heartbeat::Heartbeat;
use crate::host_memory;
use crate::launch::Identity;
use crate::machine::{core_cache, cores, last_level_cache};
use crate::rendezvous::Store;
use crate::transport::simulated::{Network, SimulatedLink};
use crate::transport::{self, Link, TransportChoice, Via, shm, tcp};
use anyhow::Result;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// With `NCCL_DEBUG=INFO`, a rank with shared-memory or TCP links says at its end how
/// many channels or connections it made: the pairs connect on first use ([`shm::connect`],
/// [`tcp::connect`]), so this is what the job's collectives really used (a ring
/// all-reduce: one per rank).
pub(super) struct ChannelReport {
    pub(super) rank: usize,
    pub(super) shm: bool,
    pub(super) tcp: bool,
}

impl Drop for ChannelReport {
    fn drop(&mut self) {
        if !debug_info() {
            return;
        }
        let made = [
            (self.shm, shm::channels_made(), "shared-memory channel(s)"),
            (self.tcp, tcp::connections_made(), "TCP connection(s)"),
        ];
        let lines: String = made
            .iter()
            .filter(|(used, _, _)| *used)
            .map(|(_, count, what)| {
                format!(
                    "cpu INFO rank {}: {count} {what} made (pairs connect on first use)\n",
                    self.rank
                )
            })
            .collect();
        // One write, so that the ranks' lines do not interleave.
        let _ = std::io::Write::write_all(&mut std::io::stderr(), lines.as_bytes());
    }
}

impl Comm {
    /// Connects a CPU-backend rank to its peers, as NCCL's init does for its ranks: the links, shared memory to the ranks on its machine and TCP
    /// to the others (or as `--transport` says), the choice for every pair ("0-1": shm), and
    /// whether every neighbour pair of the ring (i, i + 1) shares memory, so that the
    /// all-reduce may run piece by piece.
    /// Every rank takes part in both setups, even with no peer of that kind, because each
    /// setup gathers from every rank through the store.
    /// `via` is `--transport`; every wait lasts at most `timeout`; `network` (`--link`)
    /// makes every TCP link take the time of a simulated network's ([`SimulatedLink`]).
    pub fn connect(
        store: &mut Store,
        id: &Identity,
        host: &str,
        via: TransportChoice,
        timeout: Duration,
        network: Option<Network>,
        names: fn(u8) -> &'static str,
    ) -> Result<(Comm, BTreeMap<String, Via>)> {
        let (rank, world) = (id.rank, id.world_size);
        // Beats from now on, on a thread and a store connection of its own: a rank stopped
        // from here on is named as such by the others (no heartbeat), never confused with
        // the ranks that wait for it. Not rank 0: it hosts the store, which stops with it
        // (the others then say so), and it holds the most descriptors already.
        let heartbeat = (rank > 0).then(|| Heartbeat::start(store, id, timeout)).flatten();
        let cores = cores().map_err(|message| SharedError { message, usage: true })?;
        // One machine = one host name and one boot: two containers may share a name, not a
        // boot id. Each rank says how many cores it may run on, after its machine.
        let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
        let machine = format!("{host} {}\n{cores}", boot.trim());
        let said = store.share("cpu/machine", rank, world, machine.as_bytes(), "every rank's machine")?;
        let said: Vec<(String, usize)> = said
            .iter()
            .map(|k| {
                let text = String::from_utf8_lossy(k);
                let (machine, cores) = text.rsplit_once('\n').unwrap_or((&text, "1"));
                (machine.to_string(), cores.parse().unwrap_or(1))
            })
            .collect();
        let keys: Vec<String> = said.iter().map(|(k, _)| k.clone()).collect();
        // Some machine runs more ranks than the fewest cores any of its ranks may use: the
        // same answer on every rank, from what every rank said.
        let oversubscribed = said.iter().any(|(k, c)| keys.iter().filter(|o| *o == k).count() > *c);
        let table = transport::choose(&keys, via).map_err(|message| SharedError { message, usage: true })?;
        let every = || table.iter().flatten().flatten();
        if let Some(net) = network {
            simulable(&keys, every().any(|v| *v == Via::Tcp), &net)
                .map_err(|message| SharedError { message, usage: true })?;
        }

        let mut links: Vec<Option<Arc<dyn Link>>> = (0..world).map(|_| None).collect();
        if every().any(|v| *v == Via::Tcp) {
            let wanted: Vec<bool> = table[rank].iter().map(|v| *v == Some(Via::Tcp)).collect();
            let ip = tcp::local_ip_towards(&id.master_addr, id.store_port)?;
            for (peer, link) in tcp::connect(store, rank, &id.job_id, &wanted, ip, timeout)?
                .into_iter()
                .enumerate()
            {
                links[peer] = match (link, network) {
                    (Some(link), Some(net)) => Some(Arc::new(SimulatedLink::new(Box::new(link), net, timeout))),
                    (Some(link), None) => Some(Arc::new(link)),
                    (None, _) => None,
                };
            }
        }
        let any_shm = every().any(|v| *v == Via::Shm);
        if any_shm {
            shm::available()?;
            let peers: Vec<usize> = (0..world).filter(|p| table[rank][*p] == Some(Via::Shm)).collect();
            for link in shm::connect(store, rank, world, &peers, timeout)? {
                let peer = link.peer();
                links[peer] = Some(Arc::new(link));
            }
        }
        let mut pairs = BTreeMap::new();
        for (a, row) in table.iter().enumerate() {
            for (b, via) in row.iter().enumerate().skip(a + 1) {
                if let Some(via) = via {
                    pairs.insert(format!("{a}-{b}"), *via);
                }
            }
        }
        let ring_in_memory = (0..world).all(|a| world == 1 || table[a][(a + 1) % world] == Some(Via::Shm));
        // Results stream around the cache once the buffers of every rank on this host
        // together outgrow its last-level cache.
        let local = keys.iter().filter(|k| **k == keys[rank]).count();
        let llc = last_level_cache().map_err(|message| SharedError { message, usage: true })?;
        let core = core_cache(local, cores).map_err(|message| SharedError { message, usage: true })?;
        // One host for the whole job: each rank's large buffers go where the others can read them.
        let arenas = match world > 1 && every().all(|v| *v == Via::Shm) {
            true => host_memory::connect(store, rank, world)?,
            false => None,
        };
        let mut comm = Comm::new(rank, world, links, ring_in_memory, names, llc / local);
        comm.report.shm = any_shm;
        comm.report.tcp = table[rank].contains(&Some(Via::Tcp));
        comm.heartbeat = heartbeat.map(Arc::new);
        comm.shm_on_node = via != TransportChoice::Tcp;
        let comm = comm
            .with_core_cache(core.filter(|_| world > 1 && every().all(|v| *v == Via::Shm)))
            .with_peer_arenas(arenas)
            .oversubscribed_by(oversubscribed)
            .with_protocols(world > 1 && every().all(|v| *v == Via::Shm))
            .on_nodes(number_machines(&keys))
            .on_wire(
                network
                    .filter(|_| table[rank].contains(&Some(Via::Tcp)))
                    .map(|n| (n, timeout)),
            );
        Ok((comm, pairs))
    }
}

/// Whether `--link` can simulate this job's network: some pair of ranks must talk over
/// TCP (the simulated links are TCP's), and every rank must run under one kernel, whose
/// clock both ends of a link read (`keys`: each rank's `host boot-id`). Same answer on
/// every rank.
fn simulable(keys: &[String], tcp: bool, net: &Network) -> Result<(), String> {
    let link = format!("--link ({})", net.describe());
    if keys.len() < 2 {
        return Err(format!(
            "{link}: a job of one rank has no link to simulate: start two ranks or more"
        ));
    }
    if !tcp {
        return Err(format!(
            "{link}: no pair of ranks talks over TCP here (they share memory): run them as emulated nodes \
             (--nnodes, a host name each) or with --transport tcp"
        ));
    }
    let boot = |k: &String| k.rsplit(' ').next().unwrap_or_default().to_string();
    if keys.iter().any(|k| boot(k) != boot(&keys[0])) {
        return Err(format!(
            "{link} simulates the network between emulated nodes on one machine; these ranks run on several \
             machines, which have a real one: leave --link out"
        ));
    }
    Ok(())
}

/// Each machine's number, in the order of its first rank: `["b", "a", "b"]` is `[0, 1, 0]`.
fn number_machines(keys: &[String]) -> Vec<usize> {
    let mut seen: Vec<&String> = vec![];
    keys.iter()
        .map(|k| match seen.iter().position(|s| *s == k) {
            Some(i) => i,
            None => {
                seen.push(k);
                seen.len() - 1
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn machines_are_numbered_in_the_order_of_their_first_rank() {
        let keys = |k: &[&str]| k.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(number_machines(&keys(&["b", "a", "b", "c", "a"])), [0, 1, 0, 2, 1]);
        assert_eq!(number_machines(&keys(&["x"])), [0]);
    }
}
