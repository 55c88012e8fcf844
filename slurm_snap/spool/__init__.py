"""A node's durable spool of what its Epilogs cut while the inventory was
away (records.py: what an entry says; outbox.py: the directory). Standard
library only, like jobrecords/: the Epilog's path imports it."""
