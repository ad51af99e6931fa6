"""Imported first by the fork server that starts rung processes (isolation.PRELOAD), before it saves the signal
handlers its children get back: so a rung starts with Ctrl-C already ignored, even while it is still unpickling
its job. The sweep's first Ctrl-C must let the running rung finish; the second ends it by its pid."""
import signal

signal.signal(signal.SIGINT, signal.SIG_IGN)
