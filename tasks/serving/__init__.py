"""An inference server as a resource: `server.launch` and `server.stop` (launch), the
supervisors that end every process an engine forks (supervise), and one adapter per serving
engine (engines/): how to launch it, how it says it is ready and what it is, its streams and
its acceptance counters."""
