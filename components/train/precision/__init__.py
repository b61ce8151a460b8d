"""The precision a run trains in, chosen from the hardware or measured.

The policy, XLA and native formats (`policy.py`), and the measured search among candidates
(`autotune.py`, its child process `autotune_child.py`, the candidates and drop rule in
`autotune_rules.py`).
"""
