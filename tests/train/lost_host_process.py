"""One process of a 2-process jax.distributed job joined through zoo.train.hosts.lost_hosts
(heartbeat timeout 2 s), for tests/train/hosts/test_lost_hosts.py: no model, only the exit paths.

    python tests/train/lost_host_process.py ADDRESS PROCESS_ID MODE DIR

MODE is what the main thread does once it has joined (after writing DIR/joined_<PROCESS_ID>):
  finish          returns at once: a clean exit, through the exit barrier
  finish_late     sleeps 3 s, then returns: the other process reaches the barrier first
  raise_when_cut  waits for DIR/peer_killed (the test writes it after SIGKILLing the peer),
                  then raises as a collective does when its peer's socket closes (gloo:
                  "Connection reset by peer"): the survivor's main thread ends in an error
                  while the watch thread has not yet heard of the loss
  abort_when_cut  waits for DIR/peer_killed, then a thread of no Python code of its own
                  calls abort(), as gloo's transport thread does on a message of the wrong size
                  once the peer's socket broke one device's collective (std::terminate)
  abort_at_exit   finishes, and aborts after the exit barrier (a crash on the way out)
  wait            sleeps until killed
"""

import atexit
import ctypes
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from zoo.train.hosts import lost_hosts  # noqa: E402

HEARTBEAT_TIMEOUT_S = 2


def _abort() -> None:
    ctypes.CDLL(None).abort()


def main(address: str, process_id: int, mode: str, directory: str) -> None:
    if mode == "abort_at_exit":
        atexit.register(_abort)  # runs after the exit barrier, registered later by join
    lost_hosts.join(HEARTBEAT_TIMEOUT_S, dict(coordinator_address=address, num_processes=2,
                                              process_id=process_id))
    open(os.path.join(directory, f"joined_{process_id}"), "w").close()
    if mode == "finish_late":
        time.sleep(3)
    elif mode in ("raise_when_cut", "abort_when_cut"):
        while not os.path.exists(os.path.join(directory, "peer_killed")):
            time.sleep(0.05)
        if mode == "abort_when_cut":
            threading.Thread(target=_abort).start()
            time.sleep(3600)
        raise RuntimeError("UNKNOWN: Gloo all-reduce failed: Read error: Connection reset by "
                           "peer (injected by lost_host_process.py)")
    elif mode == "wait":
        while True:
            time.sleep(1)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4])
