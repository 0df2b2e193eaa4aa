"""`gpufleet engines probe URL`: scrape one engine endpoint and say what was understood."""

from __future__ import annotations

import argparse
import json

from gpufleet.client.present import NA, message_fields
from gpufleet.collector.sources.engines.scrape import Endpoint, EngineScraper


def run_engines_probe(args: argparse.Namespace) -> int:
    scraper = EngineScraper([Endpoint(args.url)], timeout_s=args.timeout)
    try:
        sample = scraper.scrape_all()[0]
    finally:
        scraper.close()
    if args.json:
        print(json.dumps(message_fields(sample), indent=2))
    elif not sample.readable:
        print(f"unreadable: {sample.unreadable_reason}")
    else:

        def show(name: str, fmt: str = ".2f") -> str:
            return format(getattr(sample, name), fmt) if sample.HasField(name) else NA

        print(f"{sample.engine} serving {sample.model} at {sample.endpoint}")
        print(f"  KV-cache usage        {show('kv_cache_usage_ratio')}")
        print(f"  requests running      {show('requests_running', '.0f')}")
        print(f"  requests waiting      {show('requests_waiting', '.0f')}")
        print(f"  preemptions (total)   {show('preemptions_total', '.0f')}")
        print(f"  prefix-cache hits     {show('prefix_cache_hit_ratio')}")
    return 0 if sample.readable else 1
