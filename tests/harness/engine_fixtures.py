"""Realistic /metrics text of each inference engine (names and labels as the engines expose
them; see ../shared/research/kv_metrics.md)."""

VLLM_NEW = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 12.0
vllm:num_requests_running{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 9.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 3.0
vllm:num_requests_waiting{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.8731
vllm:kv_cache_usage_perc{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.6402
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 17.0
vllm:num_preemptions_total{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 4.0
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 100000.0
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 25000.0
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",num_gpu_blocks="27000",num_cpu_blocks="None"} 1.0
"""

VLLM_OLD = """\
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="mistralai/Mistral-7B-Instruct-v0.3"} 0.42
# HELP vllm:num_requests_running Number of requests currently running on GPU.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="mistralai/Mistral-7B-Instruct-v0.3"} 5.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="mistralai/Mistral-7B-Instruct-v0.3"} 1.0
"""

SGLANG = """\
# HELP sglang:token_usage The token usage
# TYPE sglang:token_usage gauge
sglang:token_usage{engine_type="unified",model_name="Qwen/Qwen2.5-72B-Instruct",pp_rank="0",tp_rank="0"} 0.61
sglang:token_usage{engine_type="unified",model_name="Qwen/Qwen2.5-72B-Instruct",pp_rank="0",tp_rank="1"} 0.66
sglang:token_usage{engine_type="unified",model_name="Qwen/Qwen2.5-72B-Instruct",pp_rank="0",tp_rank="2"} 0.59
sglang:token_usage{engine_type="unified",model_name="Qwen/Qwen2.5-72B-Instruct",pp_rank="0",tp_rank="3"} 0.6
# HELP sglang:num_running_reqs The number of running requests
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{engine_type="unified",model_name="Qwen/Qwen2.5-72B-Instruct",pp_rank="0",tp_rank="0"} 31.0
sglang:num_running_reqs{engine_type="unified",model_name="Qwen/Qwen2.5-72B-Instruct",pp_rank="0",tp_rank="1"} 31.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{engine_type="unified",model_name="Qwen/Qwen2.5-72B-Instruct",pp_rank="0",tp_rank="0"} 7.0
sglang:num_queue_reqs{engine_type="unified",model_name="Qwen/Qwen2.5-72B-Instruct",pp_rank="0",tp_rank="1"} 7.0
# HELP sglang:cache_hit_rate The prefix cache hit rate
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{engine_type="unified",model_name="Qwen/Qwen2.5-72B-Instruct",pp_rank="0",tp_rank="0"} 0.37
# HELP sglang:num_retracted_reqs The number of retracted requests
# TYPE sglang:num_retracted_reqs gauge
sglang:num_retracted_reqs{engine_type="unified",model_name="Qwen/Qwen2.5-72B-Instruct",pp_rank="0",tp_rank="0"} 2.0
"""

TGI = """\
# TYPE tgi_queue_size gauge
tgi_queue_size 4
# TYPE tgi_batch_current_size gauge
tgi_batch_current_size 16
# TYPE tgi_batch_current_max_tokens gauge
tgi_batch_current_max_tokens 12288
# TYPE tgi_batch_max_total_tokens gauge
tgi_batch_max_total_tokens 16384
# TYPE tgi_request_count counter
tgi_request_count 8123
"""

TRTLLM = """\
# HELP nv_trt_llm_request_metrics TRT LLM request metrics
# TYPE nv_trt_llm_request_metrics gauge
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="active",version="1"} 8
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="max",version="1"} 64
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="scheduled",version="1"} 8
nv_trt_llm_request_metrics{model="tensorrt_llm",request_type="waiting",version="1"} 2
# HELP nv_trt_llm_kv_cache_block_metrics TRT LLM KV cache block metrics
# TYPE nv_trt_llm_kv_cache_block_metrics gauge
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="max",model="tensorrt_llm",version="1"} 4096
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="used",model="tensorrt_llm",version="1"} 3072
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="free",model="tensorrt_llm",version="1"} 1024
nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="tokens_per",model="tensorrt_llm",version="1"} 64
"""

GARBAGE = "<html><body>502 Bad Gateway</body></html>\n{not metrics at all"
TRUNCATED = VLLM_NEW[:400]
NAN = VLLM_NEW.replace("0.8731", "NaN")
WRONG_RANGE = VLLM_NEW.replace("0.8731", "87.31")
NOT_AN_ENGINE = "# TYPE node_load1 gauge\nnode_load1 0.42\n"
