"""The application shell: the `lapse` command, process roles, supervisor and metrics endpoint, and
what only they need — topic provisioning and ACLs, start-up checks, signal handling, masked
settings. It reaches the rooms only through their faces."""
