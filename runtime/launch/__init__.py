"""Process start-up: launching and watching the child processes, their entry point, IPC names."""
