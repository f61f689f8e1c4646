"""What the commands return: one frozen result class per command (`energy`, `variance`,
`train`, `dynamics`, `report`, `figures`, `sample`, `inspect`), each with `to_json()` (its
record file: summary.json, train.json, collapse.json, sample's manifest.json, with a
`schema_version`; inspect's `--json`, versioned alike; figures.json as committed) and
`format()` (what the CLI prints); `read` loads a run's record file back into its class and
refuses another schema version (`schema`). Outside these modules nothing indexes a result's
record by key: readers use fields. Torch-free, so `report` and `regress` load fast."""
