pytest_plugins = ["tests.fixtures_kafka", "tests.fixtures_db", "tests.pipeline_env"]
