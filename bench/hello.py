"""Gloo's hello world, the counterpart of 00-nccl-hello-world for compare-gloo.sh.

torchrun starts the ranks and sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT;
init_process_group meets them there (the rendezvous), and every rank says who it is.
"""

import torch.distributed as dist

dist.init_process_group("gloo")
print(f"Hello from rank {dist.get_rank()} of {dist.get_world_size()}", flush=True)
dist.destroy_process_group()
