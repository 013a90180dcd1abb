"""Fleet: one plan rolled over many hosts through Ansible, with a record on the controller.

Ansible reaches the hosts (inventory, SSH, forks); orch runs the plan on each host with its own
store there (`host.py`, the one command a batch runs), and the controller keeps which host is
at which step of which roll (`record.py`), committed before each batch starts, so a killed
controller resumes the roll exactly (`roll.py`).

May import: core, proc, store, kinds, plan, run, views, api, agent (all below it; not cli).
"""
