"""The fleet beyond this machine: sites, and cloud nodes that join and leave."""
