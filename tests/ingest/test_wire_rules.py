"""The wire rules cover every field a collector can send, and only fields that exist: a field
added to a .proto without a rule fails here (and the aggregator refuses to start)."""

from __future__ import annotations

import math

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import FieldDescriptor
from hypothesis import HealthCheck, given, settings

from gpufleet.aggregator.ingest.schema import GPU_VALUE_FIELDS
from gpufleet.aggregator.ingest.wire_rules import (
    INT64_MAX,
    RULES,
    Many,
    MissingRule,
    Nested,
    Num,
    Text,
    WireValidator,
    reachable,
)
from gpufleet.protos import ingest_pb2, telemetry_pb2
from harness.wire_strategies import Case, hellos, reports

_INTS = {
    FieldDescriptor.TYPE_INT32,
    FieldDescriptor.TYPE_INT64,
    FieldDescriptor.TYPE_UINT32,
    FieldDescriptor.TYPE_UINT64,
    FieldDescriptor.TYPE_SINT32,
    FieldDescriptor.TYPE_SINT64,
    FieldDescriptor.TYPE_FIXED32,
    FieldDescriptor.TYPE_FIXED64,
}
_FLOATS = {FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT}


def wire_fields() -> list[FieldDescriptor]:
    return [f for d in reachable(ingest_pb2.CollectorMessage.DESCRIPTOR) for f in d.fields]


def test_every_field_a_collector_sends_has_a_rule_and_every_rule_a_field() -> None:
    names = {f"{f.containing_type.name}.{f.name}" for f in wire_fields()}
    assert names - RULES.keys() == set(), "fields without a rule"
    assert RULES.keys() - names == set(), "rules for fields that do not exist"
    WireValidator()  # compiles


@pytest.mark.parametrize("field", wire_fields(), ids=lambda f: f"{f.containing_type.name}.{f.name}")
def test_each_rule_fits_its_field_and_both_stores(field: FieldDescriptor) -> None:
    rule = RULES[f"{field.containing_type.name}.{field.name}"]
    if field.is_repeated:
        assert isinstance(rule, Many) and 0 < rule.max_items <= 4096
        rule = rule.each
    if field.type in _INTS | _FLOATS:
        assert isinstance(rule, Num)
        assert math.isfinite(rule.low) and math.isfinite(rule.high) and rule.low <= rule.high
        # SQLite and InfluxDB integers are int64: no rule may let a larger one through.
        assert rule.low >= -INT64_MAX - 1 and rule.high <= INT64_MAX
    elif field.type == FieldDescriptor.TYPE_STRING:
        assert isinstance(rule, Text) and 0 < rule.max_len <= 4096
    elif field.type == FieldDescriptor.TYPE_MESSAGE:
        assert isinstance(rule, Nested)


def test_a_field_added_without_a_rule_stops_the_validator() -> None:
    # The NodeReport of telemetry.proto with one more field, as a .proto change would add it.
    file = descriptor_pb2.FileDescriptorProto()
    telemetry_pb2.DESCRIPTOR.CopyToProto(file)
    file.name = "gpufleet/v1/telemetry_changed.proto"
    file.package = "gpufleet.changed"
    del file.dependency[:]
    from gpufleet.protos import vocabulary_pb2

    vocab = descriptor_pb2.FileDescriptorProto()
    vocabulary_pb2.DESCRIPTOR.CopyToProto(vocab)
    vocab.name = "gpufleet/v1/vocabulary_changed.proto"
    vocab.package = "gpufleet.changed"
    file.dependency.append(vocab.name)
    for message in file.message_type:
        for f in message.field:
            if f.type_name.startswith(".gpufleet.v1."):
                f.type_name = f.type_name.replace(".gpufleet.v1.", ".gpufleet.changed.")
    report = next(m for m in file.message_type if m.name == "NodeReport")
    report.field.add(
        name="fan_speed_rpm",
        number=99,
        type=FieldDescriptor.TYPE_UINT64,
        label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL,
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(vocab)
    pool.Add(file)
    changed = message_factory.GetMessageClass(pool.FindMessageTypeByName("gpufleet.changed.NodeReport"))
    with pytest.raises(MissingRule, match=r"NodeReport\.fan_speed_rpm"):
        WireValidator(changed.DESCRIPTOR)


@pytest.mark.parametrize(
    "build,path,why",
    [
        (lambda r: setattr(r, "seq", 2**64 - 1), "seq", "is outside 1..9223372036854775807"),
        (lambda r: setattr(r.stats, "reconnects_total", 2**64 - 1), "stats.reconnects_total", "is outside"),
        (lambda r: r.events.add(pid=2**64 - 1), "events[0].pid", "is outside 0..2147483647"),
        (
            lambda r: setattr(r.stats, "sample_duration_s", math.nan),
            "stats.sample_duration_s",
            "not a finite",
        ),
        (lambda r: r.gpus.add(index=0, temp_gpu_c=-math.inf), "gpus[0].temp_gpu_c", "not a finite"),
        (lambda r: r.gpus.add(index=0, model="H100\nx"), "gpus[0].model", "holds '\\n'"),
        (lambda r: r.gpus.add(index=0, uuid="GPU-1\\"), "gpus[0].uuid", "backslashes"),
        (lambda r: r.events.add(kind=77), "events[0].kind", "is no EventKind value"),
        (lambda r: r.engines.add(gpu_indices=[70]), "engines[0].gpu_indices[0]", "is outside 0..63"),
        (lambda r: r.events.add(message="x" * 5000), "events[0].message", "at most 4096"),
    ],
)
def test_the_edge_values_that_stopped_ingest_are_refused_by_name(build: object, path: str, why: str) -> None:
    report = telemetry_pb2.NodeReport(node="n", boot_id="b", seq=1)
    build(report)  # type: ignore[operator]
    found = WireValidator().find(ingest_pb2.CollectorMessage(report=report))
    assert found is not None
    assert found[0] == f"report.{path}" and why in found[2]


def test_a_valid_report_passes() -> None:
    report = telemetry_pb2.NodeReport(node="n", cluster="c", boot_id="b", seq=2**63 - 1, time_unix_ns=1)
    report.gpus.add(index=0, uuid="GPU-0", model="NVIDIA H100 80GB HBM3", util_gpu_pct=-0.0, power_w=5e-324)
    report.events.add(message="tab\tis fine; ünïcode too 🚀", pid=2**31 - 1)
    assert WireValidator().find(ingest_pb2.CollectorMessage(report=report)) is None


SHARED = WireValidator()


@pytest.mark.slow
@settings(max_examples=200, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])  # fmt: skip
@given(case=reports(), h=hellos())
def test_the_fast_check_and_the_explaining_check_always_agree(case: Case, h: ingest_pb2.Hello) -> None:
    """ok() decides for every report; find() only explains a refusal: they must never differ,
    and values() must copy exactly the measurement fields a GPU sample carries. One validator
    serves every example, as in the aggregator: its cache of good strings is exercised too."""
    validator = SHARED
    for msg in (ingest_pb2.CollectorMessage(report=case.report), ingest_pb2.CollectorMessage(hello=h)):
        assert validator.ok(msg) == (validator.find(msg) is None), msg
    for gpu in case.report.gpus:
        values = validator.values(gpu, frozenset(GPU_VALUE_FIELDS))
        assert (values is not None) == (validator.find(gpu) is None)
        if values is not None:
            assert values == {fd.name: v for fd, v in gpu.ListFields() if fd.name in GPU_VALUE_FIELDS}


def test_a_string_good_for_one_field_is_still_too_long_for_a_shorter_one() -> None:
    validator = WireValidator()
    model = "M" * 100  # a fine GPU model (tag, at most 128), remembered as good characters
    first = telemetry_pb2.NodeReport(node="n", boot_id="b", seq=1, time_unix_ns=1)
    first.gpus.add(index=0, model=model)
    assert validator.ok(ingest_pb2.CollectorMessage(report=first))
    second = telemetry_pb2.NodeReport(node="n", boot_id="b", seq=2, time_unix_ns=1)
    second.gpus.add(index=0, pci_bus_id=model)  # a tag of at most 32
    gpu = second.gpus[0]
    assert validator.values(gpu, frozenset(GPU_VALUE_FIELDS)) is None
    assert not validator.ok(ingest_pb2.CollectorMessage(report=second))
    assert validator.find(gpu) == ("pci_bus_id", model, "is 100 characters; at most 32")
