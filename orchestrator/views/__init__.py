"""What people and programs read: a consistent look at a store (snapshot), the todo board and
its JSON (board), the live board on a terminal (liveboard), the event feed (events) and the
HTML report (report), with a kind's section that fails in it (sectionfaults).

May import: core, proc, store, kinds, plan, run.
"""
