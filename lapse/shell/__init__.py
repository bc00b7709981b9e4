"""The application shell: the `lapse` command, process roles, supervisor and metrics endpoint."""
