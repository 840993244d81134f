"""What making a group's asynctp communicator costs, on the process group's own NCCL communicator
(shared) and on one of asynctp's own: the creation's wall time and the GPU memory it takes (free
memory before and after, torch.cuda.mem_get_info), per rank, in one run.

    torchrun --nproc-per-node 2 bench/communicator_cost.py [--repeat 3]
"""

import argparse
import datetime
import os
import time

import torch
import torch.distributed as dist

import asynctp


def cost(group, share):
    torch.cuda.synchronize()
    free_before = torch.cuda.mem_get_info()[0]
    start = time.perf_counter()
    comm = asynctp.communicator(group, share_nccl=share)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    free_after = torch.cuda.mem_get_info()[0]
    assert comm.shares_nccl_comm == share, f"asked share_nccl={share}, got {comm.shares_nccl_comm}"
    asynctp.shutdown(group)
    return seconds, free_before - free_after


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="communicators made each way (default 3)")
    args = parser.parse_args()
    rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device, timeout=datetime.timedelta(seconds=120))
    world = dist.get_world_size()
    for i in range(args.repeat):
        for share in (True, False):
            group = dist.new_group(list(range(world)), device_id=device)
            seconds, taken = cost(group, share)
            if rank == 0:
                way = "shared" if share else "own   "
                print(f"{way} run {i}: {seconds * 1e3:8.1f} ms, {taken / 2**20:8.1f} MiB of GPU memory (rank 0)")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
