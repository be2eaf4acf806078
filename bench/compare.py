"""`make bench-compare`: the same scripted agent on Airlock and on LangGraph + PostgresSaver.

One process, one PostgreSQL database, the two engines interleaved run by run so both
see the same machine. The agent: N steps of one tool call each (a ~500-byte result),
then a final answer. Reports throughput and bytes per step, and their ratios.
"""

# No `from __future__ import annotations` here: LangGraph reads the node functions'
# type hints at run time and must resolve them.
import json
import os
import pathlib
import sys
import time
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/airlock_compare")

import run as airlock_bench  # noqa: E402  (bench/run.py: Django set-up and helpers)
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage  # noqa: E402
from langchain_core.runnables import RunnableConfig  # noqa: E402
from langgraph.checkpoint.postgres import PostgresSaver  # noqa: E402
from langgraph.graph import END, START, MessagesState, StateGraph  # noqa: E402
from psycopg import Connection  # noqa: E402
from psycopg.rows import dict_row  # noqa: E402

SIZES = (10, 50, 200)
CALLS_PER_ROUND = 200  # per size, engine and round, so small runs are measured over as much work
TARGETS = {10: 3.0, 50: None, 200: 5.0}  # Airlock / LangGraph throughput, judged on the median
LG_TABLES = ("checkpoints", "checkpoint_blobs", "checkpoint_writes")


class LangGraphAgent:
    def __init__(self, url: str) -> None:
        self.conn = Connection.connect(url, autocommit=True, prepare_threshold=0, row_factory=dict_row)
        self.saver = PostgresSaver(self.conn)
        self.saver.setup()

        def agent(state: MessagesState, config: RunnableConfig) -> dict[str, Any]:
            n = config["configurable"]["n"]
            turn = sum(1 for m in state["messages"] if isinstance(m, AIMessage))
            if turn < n:
                call = {"name": "bench_result", "args": {"i": turn}, "id": f"call_{turn}", "type": "tool_call"}
                return {"messages": [AIMessage(content="", tool_calls=[call])]}
            return {"messages": [AIMessage(content="done")]}

        def tools(state: MessagesState) -> dict[str, Any]:
            call = state["messages"][-1].tool_calls[0]
            result = airlock_bench.bench_result(call["args"], None)
            return {"messages": [ToolMessage(content=result, tool_call_id=call["id"], name="bench_result")]}

        def route(state: MessagesState) -> str:
            return "tools" if state["messages"][-1].tool_calls else END

        graph = StateGraph(MessagesState)
        graph.add_node("agent", agent)
        graph.add_node("tools", tools)
        graph.add_edge(START, "agent")
        graph.add_conditional_edges("agent", route, ["tools", END])
        graph.add_edge("tools", "agent")
        self.graph = graph.compile(checkpointer=self.saver)
        self.threads = 0

    def run(self, n: int) -> None:
        self.threads += 1
        config = {"configurable": {"thread_id": f"bench-{time.time_ns()}-{self.threads}", "n": n}, "recursion_limit": 4 * n + 10}
        out = self.graph.invoke({"messages": [HumanMessage(content=f"bench {n}")]}, config)
        assert out["messages"][-1].content == "done"


def timed_drive(run: Any, database: Any) -> None:
    with database:
        airlock_bench.drive(run)


def measure(label: str, fn: Any, tables_bytes: Any) -> tuple[float, int, int]:
    disk, wal = tables_bytes(), airlock_bench.wal_lsn()
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start, tables_bytes() - disk, airlock_bench.wal_lsn() - wal


def main() -> None:
    airlock_bench.setup_django()
    from agents.actions.runs import run_launch

    profile = airlock_bench.bench_profile()
    lg = LangGraphAgent(os.environ["DATABASE_URL"])
    airlock_tables = ("agents_run", "agents_transition", "agents_message", "agents_toolcall")
    rounds = int(os.environ.get("BENCH_ROUNDS", "5"))
    samples: dict[int, list[dict[str, Any]]] = {n: [] for n in SIZES}
    for _ in range(rounds):
        for n in SIZES:
            totals = {"airlock": [0.0, 0, 0], "langgraph": [0.0, 0, 0]}
            runs = max(1, CALLS_PER_ROUND // n)
            airlock_db = airlock_bench.DatabaseTime()
            for _ in range(runs):
                # Interleaved: each engine's run sits next to the other's on the same machine.
                launched = run_launch(agent=profile, task=f"compare {n}", script=airlock_bench.script_of(n))
                a = measure("airlock", lambda r=launched, db=airlock_db: timed_drive(r, db), lambda: airlock_bench.table_bytes(airlock_tables))
                b = measure("langgraph", lambda n=n: lg.run(n), lambda: airlock_bench.table_bytes(LG_TABLES))
                for name, m in (("airlock", a), ("langgraph", b)):
                    totals[name] = [x + y for x, y in zip(totals[name], m, strict=True)]
            calls = n * runs
            sample: dict[str, Any] = {}
            for name, (seconds, disk, wal) in totals.items():
                sample[name] = {
                    "steps_per_second": calls / seconds,
                    "disk_bytes_per_step": disk / calls,
                    "wal_bytes_per_step": wal / calls,
                }
            sample["throughput_ratio"] = sample["airlock"]["steps_per_second"] / sample["langgraph"]["steps_per_second"]
            # The ratio Airlock would reach if none of its time were Python: LangGraph's
            # time per step over the time Airlock's SQL statements took.
            sample["airlock"]["database_ms_per_step"] = 1000 * airlock_db.seconds / calls
            sample["airlock"]["python_ms_per_step"] = 1000 * totals["airlock"][0] / calls - sample["airlock"]["database_ms_per_step"]
            sample["ratio_without_python"] = (totals["langgraph"][0] / calls) / (airlock_db.seconds / calls)
            samples[n].append(sample)
    results: dict[str, Any] = {"rounds": rounds}
    for n, ss in samples.items():
        row: dict[str, Any] = {}
        for name in ("airlock", "langgraph"):
            row[name] = {k: airlock_bench.spread([s[name][k] for s in ss])["median"] for k in ss[0][name]}
        row["throughput_ratio"] = airlock_bench.spread([s["throughput_ratio"] for s in ss])
        row["ratio_without_python"] = airlock_bench.spread([s["ratio_without_python"] for s in ss])
        row["wal_bytes_ratio_langgraph_to_airlock"] = row["langgraph"]["wal_bytes_per_step"] / row["airlock"]["wal_bytes_per_step"]
        results[str(n)] = row
    for name in ("airlock", "langgraph"):
        results[f"{name}_wal_growth_200_to_10"] = (
            results["200"][name]["wal_bytes_per_step"] / results["10"][name]["wal_bytes_per_step"]
        )
    targets = airlock_bench.Targets()
    for n, goal in TARGETS.items():
        if goal is not None:
            targets.check(f"Airlock / LangGraph throughput, N={n} (median)", results[str(n)]["throughput_ratio"]["median"], ">=", goal)
    results["targets"] = targets.rows
    out = ROOT / "bench" / "compare.json"
    out.write_text(json.dumps(results, indent=2))
    print(f"medians of {rounds} interleaved rounds")
    print(f"{'N':>4} {'engine':>10} {'steps/s':>9} {'disk B/step':>12} {'WAL B/step':>11}")
    for n in SIZES:
        for name in ("airlock", "langgraph"):
            r = results[str(n)][name]
            print(f"{n:>4} {name:>10} {r['steps_per_second']:>9.1f} {r['disk_bytes_per_step']:>12.0f} {r['wal_bytes_per_step']:>11.0f}")
        ratio = results[str(n)]["throughput_ratio"]
        print(f"{n:>4} airlock/langgraph throughput {ratio['median']:.2f}x (rounds: {ratio['min']:.2f}-{ratio['max']:.2f})")
        a, ceiling = results[str(n)]["airlock"], results[str(n)]["ratio_without_python"]
        print(
            f"{n:>4} airlock per step: {a['database_ms_per_step']:.2f} ms in SQL statements, {a['python_ms_per_step']:.2f} ms "
            f"in Python; with no Python at all the ratio would be {ceiling['median']:.2f}x"
        )
    print(
        f"WAL per step, N=200 vs N=10: airlock {results['airlock_wal_growth_200_to_10']:.2f}x, "
        f"langgraph {results['langgraph_wal_growth_200_to_10']:.2f}x"
    )
    print("\ntargets")
    for x in results["targets"]:
        print(f"  {'met   ' if x['met'] else 'MISSED'} {x['target']:<55} measured {x['value']:g}")
    print(f"\nwritten: {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
