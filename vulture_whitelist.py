# Names that frameworks use and vulture cannot see being used (read by vulture, never run; see
# [tool.vulture] in pyproject.toml). Add a name here only when a framework or the standard library
# calls or reads it; delete anything else vulture reports.
# ruff: noqa

# pydantic and pydantic-settings: model configuration, the settings-sources hook and its parameters.
_.model_config
_.settings_customise_sources
_.dotenv_settings
_.file_secret_settings

# SQLAlchemy: a TypeDecorator's hooks, and the column-reflection event's parameters.
_.impl
_.cache_ok
_.process_bind_param
_.process_result_value
_.inspector

# alembic: each revision's module variables.
_.branch_labels

# click: a ParamType's conversion, a group's listing of its commands in --help. uvicorn: the flag
# that stops a server.
_.convert
_.format_commands
_.should_exit

# signal.signal: a handler's parameters. functools.lru_cache: an argument that is only a cache key.
_.signum
_.frame
_.mtime_ns

# dataclasses.asdict: fields written out whole (JSON of `lapse audit`, `lapse show`, the process
# stats, the soak's samples), never read one by one in Python.
_.consumed
_.delayed
_.events_seen
_.op_keys_seen
_.outcome_repeats
_.outcomes_by_status
_.final_by_status
_.without_terminal
_.without_terminal_sample
_.poison_dead_letters
_.unresolved_dead_letters
_.unresolved_sample
_.event_topic
_.event_partition
_.event_offset
_.delay_lag_records
_.outbox_oldest_s
_.oldest_eligible_s

# pytest: plugins, module marks, a hook's parameters.
_.pytest_plugins
_.pytestmark
_.nextitem

# http.server, socketserver, aiosmtpd, urllib and selenium, in the tests' fake servers and clients.
_.do_GET
_.do_POST
_.do_PUT
_.do_PATCH
_.do_DELETE
_.log_message
_.protocol_version
_.close_connection
_.daemon_threads
_.allow_reuse_address
_.handle_DATA
_.redirect_request
_.binary_location

# Jinja2: the console's chart geometry, read only by templates/_chart.html.
_.legend
