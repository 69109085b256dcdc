"""Fault campaigns (CONTRACT §6, §12): kills at random moments and outages of the queue,
the databases and the disk, against real consumers, real agents and real servers."""
