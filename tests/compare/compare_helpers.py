"""What the comparison tests share: records without their timings."""
import json

TIMING = {"train_samples_per_s", "latency_ms"}


def untimed(record: dict) -> dict:
    return {k: v for k, v in record.items() if k not in TIMING and not k.endswith("wall_s")}


def records(directory) -> list:
    return json.loads((directory / "results.json").read_text())["records"]
