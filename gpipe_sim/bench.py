def run_benchmark(K, M, r): return "todo"
