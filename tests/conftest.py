pytest_plugins = ["tests.fixtures_kafka", "tests.fixtures_db"]
