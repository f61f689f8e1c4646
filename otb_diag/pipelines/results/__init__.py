"""What the commands return and write as `summary.json`: one frozen result class per command
(`energy`, `variance`), each with `to_json()` (the file's content, with `schema_version`),
`from_json()` and `format()` (what the CLI prints); `read` loads a run directory's summary.json
into its class. Outside these modules nothing indexes a summary by key: readers use fields."""
