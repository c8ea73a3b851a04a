"""What more than one pipeline is built from.

- :mod:`.items`: the items that travel between the steps of the dataflows;
- :mod:`.steps`: pure steps of the send and reconcile dataflows (no I/O);
- :mod:`.toolbox`: composite steps (parse or dead-letter, hold until due, guard and emit);
- :mod:`.guard`: the DLQ limit that halts a flow on a systemic flood of dead letters;
- :mod:`.runner`: runs a dataflow in this process, always with Bytewax recovery;
- :mod:`.yielding`: the window by which bulk work yields to P0.
"""
