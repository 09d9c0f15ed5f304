"""Pure transforms: Spark DataFrames in, DataFrames out; no reads, writes or clock."""
