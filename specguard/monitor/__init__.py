"""Act and run: daemon, actuators, receiver, persisted state, CLI, simulator, sweep, demo, report."""
