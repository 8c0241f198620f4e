"""clients.records: one record by name and kind, against Flower's own typed views."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from clients.records import find_record, get_record

KINDS = (ArrayRecord, ConfigRecord, MetricRecord)
VIEWS: dict[type, str] = {ArrayRecord: "array_records", ConfigRecord: "config_records",
                          MetricRecord: "metric_records"}


def content() -> RecordDict:
    return RecordDict({
        "a": ArrayRecord({"x": Array(np.arange(3, dtype=np.float32))}),
        "c": ConfigRecord({"k": b"v", "n": 2}),
        "m": MetricRecord({"loss": 0.5}),
        "c2": ConfigRecord({}),
    })


@pytest.mark.parametrize(("key", "kind"), list(itertools.product(["a", "c", "m", "c2", "absent"], KINDS)))
def test_the_same_outcome_as_flowers_typed_view(key: str, kind: type) -> None:
    """Every key × kind: the same record object, or a KeyError / None where the view has none."""
    body = content()
    view = getattr(body, VIEWS[kind])
    if key in view:
        assert get_record(body, key, kind) is view[key]
        assert find_record(body, key, kind) is view[key]
    else:
        with pytest.raises(KeyError):
            get_record(body, key, kind)
        assert find_record(body, key, kind) is None
        assert view.get(key) is None
