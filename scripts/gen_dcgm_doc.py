"""Write the DCGM face's field table (collector/dcgm_face.py docs_table, from the signal catalog)
into docs/prometheus-and-grafana.md between its dcgm-fields markers."""

from __future__ import annotations

from pathlib import Path

from gpufleet.collector.dcgm_face import docs_table

DOC = Path(__file__).resolve().parent.parent / "docs" / "prometheus-and-grafana.md"
BEGIN, END = "<!-- dcgm-fields: begin (scripts/gen_dcgm_doc.py) -->\n", "<!-- dcgm-fields: end -->\n"


def main() -> None:
    text = DOC.read_text()
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    DOC.write_text(head + BEGIN + docs_table() + END + tail)
    print(f"wrote the DCGM field table of {DOC}")


if __name__ == "__main__":
    main()
