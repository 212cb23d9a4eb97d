"""The trainer's multi-host side: joining the other processes (`distributed.py`), noticing a lost
one through the coordination service (`lost_hosts.py`, `coordinator_watch.py`), a hung step
(`watchdog.py`) and an abort that must not leave the others waiting (`abort_hold.py` with its C
handler `abort_hold.cc`)."""
