"""Training: one trainer (loss -> optimizer step) and the hosts that run it (a thread, a
child process, the device, torchrun ranks)."""
