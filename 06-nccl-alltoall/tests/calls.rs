//! `--show-calls` on the all-to-all: NCCL has no all-to-all call, so each rank opens a
//! group, sends one block to every peer and receives one from every peer, and closes it.

const BIN: &str = env!("CARGO_BIN_EXE_06-nccl-alltoall");

#[test]
fn the_all_to_all_is_a_group_of_sends_and_receives_one_per_peer() {
    let r = testkit::run(BIN, &["--simulate-gpus", "3", "--show-calls", "--count", "6"]).ok();
    for rank in 0..3 {
        let prefix = format!("rank {rank} │ ");
        let calls: Vec<&str> = r
            .stdout
            .lines()
            .filter_map(|l| l.strip_prefix(&prefix))
            .filter(|c| c.starts_with("nccl") && !c.starts_with("ncclCommGetAsyncError"))
            .collect();
        let start = calls
            .iter()
            .position(|c| c.starts_with("ncclGroupStart()"))
            .unwrap_or_else(|| panic!("rank {rank} opened no group:\n{r}"));
        // One block of --count 6 elements to and from each peer, self included, 24 bytes apart.
        for (i, peer) in (0..3).enumerate() {
            let send = calls[start + 1 + 2 * i];
            let recv = calls[start + 2 + 2 * i];
            assert!(send.starts_with("ncclSend(sendbuff=0x"), "{send}");
            assert!(
                send.contains(&format!("count=6, datatype=ncclFloat32, peer={peer}, comm=")),
                "{send}"
            );
            assert!(recv.starts_with("ncclRecv(recvbuff=0x"), "{recv}");
            assert!(recv.contains(&format!("peer={peer}, ")), "{recv}");
        }
        assert!(calls[start + 7].starts_with("ncclGroupEnd()"), "{}", calls[start + 7]);
    }
}
