"""The evaluation lab: demo, replay, sweep, scenarios, load generator and report, on top of the
service and the simulator."""
