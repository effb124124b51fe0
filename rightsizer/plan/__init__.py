"""The plan contract (plan.json), building it from proposals, the pipeline, its tables."""
