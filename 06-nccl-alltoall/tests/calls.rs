//! `--show-calls` on the all-to-all: NCCL's API had no all-to-all call before 2.28 (the
//! workbook builds against 2.24's), so each rank opens a group, sends one block to every
//! peer and receives one from every peer, and closes it.

const BIN: &str = env!("CARGO_BIN_EXE_06-nccl-alltoall");

#[test]
fn the_all_to_all_is_a_group_of_sends_and_receives_one_per_peer() {
    let r = testkit::run(BIN, &["--simulate-gpus", "3", "--show-calls", "--count", "6"]).ok();
    for rank in 0..3 {
        let calls: Vec<String> = testkit::calls(&r.stdout, rank)
            .into_iter()
            .filter(|c| c.starts_with("nccl") && !c.starts_with("ncclCommGetAsyncError"))
            .collect();
        let start = calls
            .iter()
            .position(|c| c.starts_with("ncclGroupStart()"))
            .unwrap_or_else(|| panic!("rank {rank} opened no group:\n{r}"));
        // One block of --count 6 elements to and from each peer, self included, 24 bytes apart.
        for (i, peer) in (0..3).enumerate() {
            let send = &calls[start + 1 + 2 * i];
            let recv = &calls[start + 2 + 2 * i];
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

/// A send or receive that fails inside the group (NCCL_DOUBLE_FAIL: the double's second
/// ncclRecv of each process fails, as a network failure would): from NCCL 2.22,
/// `ncclCommAbort` called while the group is open is only queued into it, and the failed
/// group drops it, so the communicator would never be freed. The rank closes the group
/// first: each rank exits 1 in one line, and every communicator is freed (the double's
/// meeting folder goes with the last one; it warns at exit about one never freed).
#[test]
fn a_call_that_fails_inside_the_group_still_frees_the_communicator() {
    for version in ["21803", "22203", "23004"] {
        let rooms =
            testkit::nccl_double_dir().with_file_name(format!("rooms-group-abort-{}-{version}", std::process::id()));
        let _ = std::fs::remove_dir_all(&rooms);
        std::fs::create_dir_all(&rooms).unwrap();
        let mut cmd = testkit::nccl_command(
            BIN,
            &["--backend", "nccl", "--nproc-per-node", "2", "--timeout", "10"],
            2,
        );
        cmd.env("NCCL_DOUBLE_VERSION", version)
            .env("NCCL_DOUBLE_FAIL", "ncclRecv:2")
            .env("NCCL_DOUBLE_DIR", &rooms);
        let r = testkit::finish(testkit::spawn(cmd), testkit::LIMIT);
        assert_eq!(r.code, Some(1), "NCCL {version}:\n{r}");
        assert!(
            r.stderr.contains("error: rank 0: ") && r.stderr.contains("error: rank 1: "),
            "NCCL {version}:\n{r}"
        );
        assert!(r.stderr.contains("an injected failure"), "NCCL {version}:\n{r}");
        assert!(!r.stderr.contains("never freed"), "NCCL {version}:\n{r}");
        let left: Vec<_> = std::fs::read_dir(&rooms)
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert!(left.is_empty(), "NCCL {version}: left behind {left:?}:\n{r}");
        std::fs::remove_dir_all(&rooms).unwrap();
    }
}
