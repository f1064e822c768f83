"""The first line of the side-by-side tables scripts/*-vs-llamacpp.sh print: the date, the CPU,
its cores and how the figures were taken."""
import datetime
import os


def header(rounds, threads=None):
    cpu = "?"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    t = f", {threads} threads" if threads is not None else ""
    return f"{datetime.date.today()}, {cpu}, {os.cpu_count()} cores{t}; medians of {rounds} interleaved rounds\n"
