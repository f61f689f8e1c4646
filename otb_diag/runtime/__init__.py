"""Where and how a command runs: devices, `--device auto` and `--device-map` (`devices`),
torchrun process groups, sharding by tokens and one rank's error stopping all (`torchrun`), and
the memory a run may use (`memory`)."""
