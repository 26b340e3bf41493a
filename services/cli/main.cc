// The `strata` binary: flags are parsed here and nowhere else, then handed to
// the commands as plain request structs. Each command group is one struct
// that owns its flags' values and registers its subcommands; main() parses,
// sets the log level and runs the chosen command.
#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "base/file.h"
#include "base/heap.h"
#include "base/log.h"
#include "base/status_macros.h"
#include "bench/adam_bench.h"
#include "bench/allreduce_bench.h"
#include "bench/chat_template_bench.h"
#include "bench/figures_bench.h"
#include "bench/generate_bench.h"
#include "bench/io_bench.h"
#include "bench/long_sequence_bench.h"
#include "bench/rollout_bench.h"
#include "bench/stream_bench.h"
#include "bench/tokenizer_bench.h"
#include "bench/transfer_bench.h"
#include "services/cli/model_commands.h"
#include "services/cli/plan_command.h"
#include "services/cli/report_commands.h"
#include "services/cli/reward_command.h"
#include "services/cli/train_command.h"

// The job service (gRPC, Redis) is left out of builds configured with
// -DSTRATA_WITH_SERVICE=OFF, e.g. on a GPU machine without those libraries.
#if STRATA_WITH_SERVICE
#include "services/cli/client_commands.h"
#include "services/cli/server_commands.h"
#include "services/coordinator/service_bench.h"
#include "services/rpc/auth.h"
#endif

namespace {

using strata::services::ParseIdList;

// Prints a command's output, or its error as "strata CMD: CODE: message".
int Finish(const std::string& command, const absl::StatusOr<std::string>& result) {
  if (!result.ok()) {
    std::fprintf(stderr, "strata %s: %s: %s\n", command.c_str(),
                 absl::StatusCodeToString(result.status().code()).c_str(),
                 std::string(result.status().message()).c_str());
    return 1;
  }
  std::fwrite(result->data(), 1, result->size(), stdout);
  return 0;
}

// Turns an optional "1,2,3" flag into ids, or records the parse error.
absl::Status FillIds(const std::string& text, const std::string& flag, std::optional<std::vector<int32_t>>* out) {
  STRATA_ASSIGN_OR_RETURN(auto ids, ParseIdList(text, flag));
  *out = std::move(ids);
  return absl::OkStatus();
}

using Runner = std::function<int()>;

// generate, logprobs, tokenize, init-model: one model, no service.
struct ModelCommands {
  strata::services::GenerateRequest gen;
  std::string gen_prompt;
  std::string gen_prompt_ids;
  strata::services::LogProbsRequest lp;
  std::string lp_ids;
  strata::services::TokenizeRequest tok;
  std::string tok_text;
  std::string tok_decode;
  std::string tok_messages;
  strata::services::InitModelRequest init;
  CLI::Option* prompt_opt = nullptr;
  CLI::Option* ids_opt = nullptr;
  CLI::Option* text_opt = nullptr;
  CLI::Option* decode_opt = nullptr;
  CLI::Option* prompts_file_opt = nullptr;
  std::string gen_prompts_file, gen_stop_ids;
  CLI::Option* messages_opt = nullptr;

  void Register(CLI::App& app, Runner& run) {
    // strata generate
    auto* generate = app.add_subcommand("generate", "Continue a prompt with a Llama-family model");
    generate->add_option("--model", gen.model_dir, "HF model directory")->required();
    generate->add_option("--adapter", gen.adapter_dir,
                         "a PEFT LoRA adapter directory of the model, applied on the fly");
    prompt_opt = generate->add_option("--prompt", gen_prompt, "prompt text (BOS added if the tokenizer asks)");
    ids_opt = generate->add_option("--prompt-ids", gen_prompt_ids, "prompt token ids, used as given: 1,2,3");
    prompts_file_opt = generate->add_option(
        "--prompts-file", gen_prompts_file,
        "JSONL, one prompt a line: {\"prompt\": TEXT}, {\"prompt_ids\": [...]} or {\"messages\": [...]}; prints one "
        "JSON line per response in input order");
    prompt_opt->excludes(ids_opt)->excludes(prompts_file_opt);
    ids_opt->excludes(prompts_file_opt);
    generate->add_option("--samples", gen.samples, "continuations per prompt, each from its own seed")
        ->check(CLI::PositiveNumber);
    generate->add_option("--stop-token-ids", gen_stop_ids, "ids that also end a response: 7,9");
    generate->add_option("--kv-block-tokens", gen.kv_block_tokens,
                         "positions per KV block (generation.kv_block_tokens)");
    generate->add_option("--max-concurrency", gen.max_concurrency,
                         "sequences decoded together at most (generation.max_concurrency; 0: no limit)");
    generate->add_option("--max-new-tokens", gen.max_new_tokens, "new tokens at most")->check(CLI::NonNegativeNumber);
    auto* greedy = generate->add_flag("--greedy", gen.greedy, "argmax decoding");
    generate->add_option("--temperature", gen.temperature, "sampling temperature (> 0)")->excludes(greedy);
    generate->add_option("--top-p", gen.top_p, "nucleus sampling mass in (0, 1]")->excludes(greedy);
    generate->add_option("--top-k", gen.top_k, "keep the k most likely tokens (0: all)")->excludes(greedy);
    generate->add_option("--seed", gen.seed, "sampling seed");
    generate->add_option("--dtype", gen.dtype, "fp32 | bf16")->check(CLI::IsMember({"fp32", "bf16"}));
    generate->add_flag("--ignore-eos", gen.ignore_eos, "keep generating past EOS");
    generate->add_flag("--json", gen.json, "print one JSON object");
    generate->callback([&] {
      run = [&] {
        if (!prompt_opt->empty()) gen.prompt = gen_prompt;
        if (!prompts_file_opt->empty()) gen.prompts_file = gen_prompts_file;
        if (!gen_stop_ids.empty()) {
          auto ids = strata::services::ParseIdList(gen_stop_ids, "--stop-token-ids");
          if (!ids.ok()) return Finish("generate", ids.status());
          gen.stop_token_ids = *ids;
        }
        if (!ids_opt->empty()) {
          if (auto s = FillIds(gen_prompt_ids, "--prompt-ids", &gen.prompt_ids); !s.ok()) return Finish("generate", s);
        }
        return Finish("generate", strata::services::RunGenerate(gen));
      };
    });

    // strata logprobs
    auto* logprobs = app.add_subcommand("logprobs", "log p(token_t | tokens before t) for t = 1..n-1");
    logprobs->add_option("--model", lp.model_dir, "HF model directory")->required();
    logprobs->add_option("--adapter", lp.adapter_dir, "a PEFT LoRA adapter directory of the model");
    logprobs->add_option("--ids", lp_ids, "token ids: 1,2,3")->required();
    logprobs->add_option("--dtype", lp.dtype, "fp32 | bf16")->check(CLI::IsMember({"fp32", "bf16"}));
    logprobs->add_flag("--json", lp.json, "print one JSON object");
    logprobs->callback([&] {
      run = [&] {
        auto ids = ParseIdList(lp_ids, "--ids");
        if (!ids.ok()) return Finish("logprobs", ids.status());
        lp.ids = std::move(*ids);
        return Finish("logprobs", strata::services::RunLogProbs(lp));
      };
    });

    // strata tokenize
    auto* tokenize = app.add_subcommand(
        "tokenize", "Encode text or decode ids (no BOS/EOS added), or render a conversation through the chat template");
    tokenize->add_option("--tokenizer", tok.tokenizer_path, "model dir, tokenizer.json or tokenizer.model")->required();
    text_opt = tokenize->add_option("--text", tok_text, "text to encode");
    decode_opt = tokenize->add_option("--decode", tok_decode, "ids to decode: 1,2,3");
    messages_opt = tokenize->add_option("--messages", tok_messages,
                                        "JSON file: a conversation ([{\"role\", \"content\"}, ...] or "
                                        "{\"messages\": [...]}) to render with the model's chat template and encode");
    text_opt->excludes(decode_opt);
    messages_opt->excludes(text_opt)->excludes(decode_opt);
    tokenize->add_flag("--add-generation-prompt", tok.add_generation_prompt, "end with the assistant's turn opening")
        ->needs(messages_opt);
    tokenize
        ->add_option("--template-arg", tok.template_args,
                     "NAME=VALUE handed to the template (repeatable; VALUE as JSON when it parses: "
                     "enable_thinking=false)")
        ->needs(messages_opt);
    tokenize->add_option("--chat-template", tok.chat_template_file, "Jinja file to use instead of the model's template")
        ->needs(messages_opt);
    tokenize->add_option("--template-name", tok.template_name, "one of the model's named templates (default: default)")
        ->needs(messages_opt);
    tokenize->add_option("--template-date", tok.template_date, "what strftime_now() sees, ISO 8601 (default: now)")
        ->needs(messages_opt);
    tokenize->add_flag("--json", tok.json, "print one JSON object");
    tokenize->callback([&] {
      run = [&] {
        if (!text_opt->empty()) tok.text = tok_text;
        if (!messages_opt->empty()) tok.messages_file = tok_messages;
        if (!decode_opt->empty()) {
          if (auto s = FillIds(tok_decode, "--decode", &tok.decode_ids); !s.ok()) return Finish("tokenize", s);
        }
        return Finish("tokenize", strata::services::RunTokenize(tok));
      };
    });

    // strata init-model
    auto* init_model = app.add_subcommand("init-model", "Write a randomly initialised Llama model directory");
    init_model->add_option("--config", init.config_path, "HF config.json")->required();
    init_model->add_option("--out", init.out_dir, "output directory")->required();
    init_model->add_option("--head", init.head, "lm | scalar")->check(CLI::IsMember({"lm", "scalar"}));
    init_model->add_option("--dtype", init.dtype, "fp32 | bf16")->check(CLI::IsMember({"fp32", "bf16"}));
    init_model->add_option("--seed", init.seed, "initialisation seed");
    init_model->add_option("--init-std", init.init_std, "standard deviation of the weights")
        ->check(CLI::PositiveNumber);
    init_model->callback([&] { run = [&] { return Finish("init-model", strata::services::RunInitModel(init)); }; });
  }
};

// train: one job in-process.
struct TrainCommands {
  strata::services::TrainRequest train;
  strata::services::RewardRequest reward;

  void Register(CLI::App& app, Runner& run) {
    // strata train
    auto* train_cmd = app.add_subcommand("train", "Run one job (sft, reward_model, remax, ppo, grpo, rloo) in-process");
    train_cmd->add_option("spec", train.spec_path, "job spec (YAML)")->required();
    train_cmd->add_option("--out", train.out_dir, "output directory (replaces output.dir)");
    train_cmd->add_option("--metrics", train.metrics_path, "metrics file (JSON lines); default <out>/metrics.jsonl");
    train_cmd->add_flag("--resume", train.resume, "continue from the latest checkpoint");
    train_cmd
        ->add_flag("--overwrite", train.overwrite, "start afresh where an earlier run left checkpoints, removing them")
        ->excludes("--resume");
    train_cmd->add_option("--workers", train.workers, "data-parallel ranks in this process (replaces parallel.workers)")
        ->check(CLI::PositiveNumber);
    train_cmd
        ->add_option("--collective-timeout-ms", train.collective_timeout_ms,
                     "how long the ranks wait in a collective for a slow or stuck rank (at least 1000)")
        ->check(CLI::Range(1000, 24 * 3600 * 1000));
    train_cmd->add_option("--set", train.overrides, "override a spec field: key.path=value (repeatable)");
    train_cmd->add_option("--allow-reward-host", train.allow_reward_hosts,
                          "HOST[:PORT] a remote reward source may call (repeatable; none by default)");
    train_cmd->add_option("--reward-secret", train.reward_secrets,
                          "NAME=FILE: a bearer token a remote reward source may name as token_secret (repeatable)");
    train_cmd->callback([&] { run = [&] { return Finish("train", strata::services::RunTrain(train)); }; });

    // strata reward
    auto* reward_cmd = app.add_subcommand("reward", "Score one response with a spec's reward sources");
    reward_cmd->add_option("spec", reward.spec_path, "job spec (YAML) with reward sources")->required();
    auto* prompt = reward_cmd->add_option("--prompt", reward.prompt, "the prompt as text");
    auto* messages = reward_cmd->add_option("--messages", reward.messages_file, "the prompt as a conversation (JSON)");
    prompt->excludes(messages);
    reward_cmd->add_option("--response", reward.response, "the response to score")->required();
    reward_cmd->add_option("--label", reward.label, "the reference answer verifiers compare with");
    reward_cmd->add_option("--set", reward.overrides, "override a spec field: key.path=value (repeatable)");
    reward_cmd->add_option("--allow-reward-host", reward.allow_reward_hosts,
                           "HOST[:PORT] a remote reward source may call (repeatable)");
    reward_cmd->add_option("--reward-secret", reward.reward_secrets, "NAME=FILE: a bearer token (repeatable)");
    reward_cmd->add_flag("--json", reward.json, "print one JSON object");
    reward_cmd->callback([&] { run = [&] { return Finish("reward", strata::services::RunReward(reward)); }; });
  }
};

#if STRATA_WITH_SERVICE
// coordinator and worker: the job service's servers.
struct ServerCommands {
  strata::services::CoordinatorCommand coord;
  strata::services::WorkerCommand wk;

  void Register(CLI::App& app, Runner& run) {
    // strata coordinator / worker
    auto* coordinator = app.add_subcommand("coordinator", "Run the job coordinator (gRPC)");
    coordinator->add_option("--listen", coord.listen, "HOST:PORT to serve on");
    coordinator->add_option("--metrics-listen", coord.metrics_listen,
                            "HOST:PORT to serve Prometheus metrics on (GET /metrics); none by default");
    coordinator->add_option("--redis", coord.redis, "redis://HOST:PORT[/DB] of the job store (no password here)");
    coordinator->add_option("--redis-password-file", coord.redis_password_file,
                            "file holding the Redis password (else $STRATA_REDIS_PASSWORD)");
    coordinator->add_option("--token-file", coord.token_file, "bearer token clients and workers must present");
    coordinator->add_option("--tokens-file", coord.tokens_file,
                            "tenants instead: lines 'TOKEN TENANT [admin]'; each tenant sees only its jobs");
    coordinator->add_option("--worker-token-file", coord.worker_token_file,
                            "with --tokens-file: the token workers present (their --token-file)");
    coordinator->add_flag("--insecure", coord.insecure, "run without a token: anyone who reaches the port is admin");
    coordinator->add_option("--tls-cert", coord.tls.cert, "PEM certificate (enables TLS)");
    coordinator->add_option("--tls-key", coord.tls.key, "PEM private key");
    coordinator->add_option("--tls-ca", coord.tls.ca, "PEM CA: require client certificates (mTLS)");
    coordinator
        ->add_option("--collective-timeout-ms", coord.collective_timeout_ms,
                     "how long a job's ranks wait in a collective for a rank that died or hangs")
        ->check(CLI::Range(1000, 3600000));
    coordinator->callback(
        [&] { run = [&] { return Finish("coordinator", strata::services::RunCoordinatorServer(coord)); }; });
    auto* worker = app.add_subcommand("worker", "Run a worker that holds a job's models (gRPC)");
    worker->add_option("--listen", wk.listen, "HOST:PORT to serve on");
    worker->add_option("--metrics-listen", wk.metrics_listen,
                       "HOST:PORT to serve Prometheus metrics on (GET /metrics); none by default");
    worker->add_option("--coordinator", wk.coordinator, "HOST:PORT of the coordinator");
    worker->add_option("--token-file", wk.token_file, "bearer token (served and presented)");
    worker->add_flag("--insecure", wk.insecure, "run without a token");
    worker->add_option("--nvme-dir", wk.nvme_dir, "NVMe tier directory for jobs that name none");
    worker->add_option("--data-root", wk.data_root,
                       "job paths must resolve inside this directory (default: the working directory)");
    worker->add_option("--allow-path", wk.allow_paths, "another directory job paths may use (repeatable)");
    worker->add_option("--allow-reward-host", wk.allow_reward_hosts,
                       "HOST[:PORT] a job's remote reward source may call (repeatable; none by default)");
    worker->add_option("--reward-secret", wk.reward_secrets,
                       "NAME=FILE: a bearer token a remote reward source may name as token_secret (repeatable)");
    worker->add_option("--max-host-mib", wk.max_host_mib, "largest memory.host_mib accepted (default 90% of RAM)")
        ->check(CLI::NonNegativeNumber);
    worker
        ->add_option("--max-rows", wk.max_rows,
                     "most rows (prompts x responses) an iteration may decode on this worker")
        ->check(CLI::PositiveNumber);
    worker
        ->add_option("--max-tokens", wk.max_tokens,
                     "most tokens (rows x (prompt + new tokens)) an iteration may hold on this worker")
        ->check(CLI::PositiveNumber);
    worker->add_option("--device-budget-mib", wk.device_budget_mib, "device budget for jobs that name none");
    worker->add_option("--id", wk.worker_id, "worker id (default worker-<listen>)");
    worker->add_option("--tls-cert", wk.tls.cert, "PEM certificate (enables TLS)");
    worker->add_option("--tls-key", wk.tls.key, "PEM private key");
    worker->add_option("--tls-ca", wk.tls.ca,
                       "PEM CA: verifies the coordinator, and the coordinator's client certificate (mTLS)");
    worker->callback([&] { run = [&] { return Finish("worker", strata::services::RunWorkerServer(wk)); }; });
  }
};
#endif

#if STRATA_WITH_SERVICE
// submit, jobs, status, watch, cancel: clients of a running coordinator.
struct ClientCommands {
  strata::services::ClientOptions client;
  std::string submit_spec;
  std::string submit_request_id;
  std::string submit_continue;
  std::vector<std::string> submit_overrides;
  std::string jobs_state;
  int jobs_page = 20;
  bool jobs_all = false;
  std::string job_id;
  bool status_json = false;

  void Register(CLI::App& app, Runner& run) {
    // Client commands: submit, jobs, status, watch, cancel.
    auto add_client_flags = [&](CLI::App* cmd) {
      cmd->add_option("--addr", client.addr, "coordinator HOST:PORT (default $STRATA_ADDR or 127.0.0.1:50051)");
      cmd->add_option("--token-file", client.token_file, "bearer token file (default $STRATA_TOKEN)");
      cmd->add_option("--tls-ca", client.tls_ca,
                      "PEM CA of the coordinator (default $STRATA_TLS_CA; plaintext without)");
      cmd->add_option("--tls-cert", client.tls_cert, "PEM client certificate, for a coordinator that requires one");
      cmd->add_option("--tls-key", client.tls_key, "PEM private key of --tls-cert");
    };
    auto* submit = app.add_subcommand("submit", "Submit a job; prints its id");
    submit->add_option("spec", submit_spec, "job spec (YAML)")->required();
    submit->add_option("--set", submit_overrides, "override a spec field: key.path=value (repeatable)");
    submit->add_option("--request-id", submit_request_id, "idempotency key: a retry returns the same job");
    submit->add_option("--continue", submit_continue,
                       "continue this ended (FAILED or CANCELLED) job from its newest checkpoint; the spec names "
                       "the same checkpoint.dir");
    add_client_flags(submit);
    submit->callback([&] {
      run = [&] {
        return Finish("submit", strata::services::RunSubmit(client, submit_spec, submit_overrides, submit_request_id,
                                                            submit_continue));
      };
    });
    auto* jobs = app.add_subcommand("jobs", "List jobs, newest first");
    jobs->add_option("--state", jobs_state, "QUEUED | RUNNING | SUCCEEDED | FAILED | CANCELLED");
    jobs->add_option("--page-size", jobs_page, "jobs per page")->check(CLI::Range(1, 200));
    jobs->add_flag("--all", jobs_all, "every page");
    add_client_flags(jobs);
    jobs->callback([&] {
      run = [&] { return Finish("jobs", strata::services::RunJobs(client, jobs_state, jobs_page, jobs_all)); };
    });
    auto* status = app.add_subcommand("status", "A job's state");
    status->add_option("job", job_id, "job id")->required();
    status->add_flag("--json", status_json, "print one JSON object");
    add_client_flags(status);
    status->callback(
        [&] { run = [&] { return Finish("status", strata::services::RunStatus(client, job_id, status_json)); }; });
    auto* watch = app.add_subcommand("watch", "Stream a job's progress until it ends (non-zero unless it SUCCEEDED)");
    watch->add_option("job", job_id, "job id")->required();
    add_client_flags(watch);
    watch->callback([&] { run = [&] { return Finish("watch", strata::services::RunWatch(client, job_id, stderr)); }; });
    auto* cancel = app.add_subcommand("cancel", "Cancel a queued or running job");
    cancel->add_option("job", job_id, "job id")->required();
    add_client_flags(cancel);
    cancel->callback([&] { run = [&] { return Finish("cancel", strata::services::RunCancel(client, job_id)); }; });
  }
};
#endif

// plan and compare: memory before a run, tables after.
struct ReportCommands {
  strata::services::PlanOptions plan_options;
  std::vector<std::string> compare_dirs;
  bool compare_json = false;
  std::string compare_plot;

  void Register(CLI::App& app, Runner& run) {
    // strata plan / compare
    auto* plan = app.add_subcommand(
        "plan", "Memory per tier and phase and time per iteration of job specs; --fit finds a placement that fits");
    plan->add_option("specs", plan_options.specs, "job specs (YAML)")->required();
    plan->add_option("--set", plan_options.overrides, "override a spec field: key.path=value (repeatable)");
    plan->add_flag("--json", plan_options.json, "print JSON: one object per spec");
    plan->add_option("--fit", plan_options.fit,
                     "search placements that fit this hardware: device=80GiB,host=128GiB,nvme=2TiB (device=cpu: "
                     "compute on the CPU)");
    plan->add_option("--workers", plan_options.workers,
                     "data-parallel ranks, as if the spec set parallel.workers (and so written by --write)")
        ->check(CLI::PositiveNumber);
    plan->add_option("--figures", plan_options.figures,
                     "`strata bench figures` output (default: $STRATA_FIGURES, ~/.cache/strata/figures.json, else "
                     "built in)");
    plan->add_option("--write", plan_options.write, "with --fit: write the spec with the chosen placement here");
    plan->add_flag("--fixed-micro-batch", plan_options.fixed_micro_batch,
                   "with --fit: keep train.micro_batch_size as the spec says (search placements only)");
    plan->add_flag("--fixed-activations", plan_options.fixed_activations,
                   "with --fit: keep each trained model's placement.activations as the spec says");
    plan->callback([&] { run = [&] { return Finish("plan", strata::services::RunPlan(plan_options)); }; });
    auto* compare = app.add_subcommand("compare", "Side-by-side table of finished runs (their output directories)");
    compare->add_option("runs", compare_dirs, "run output directories")->required();
    compare->add_flag("--json", compare_json, "print JSON");
    compare->add_option("--plot", compare_plot,
                        "also draw eval score, KL, time per phase and peak memory per tier to FILE (.png or .svg)");
    compare->callback([&] {
      run = [&] { return Finish("compare", strata::services::RunCompare(compare_dirs, compare_json, compare_plot)); };
    });
  }
};

// bench ...: each benchmark against a peer measured in the same run.
struct BenchCommands {
  strata::bench::GenerateBenchRequest gb;
  strata::bench::RolloutBenchRequest rb;
  strata::bench::IoBenchRequest io;
  strata::bench::AdamBenchRequest ab;
#if STRATA_WITH_SERVICE
  strata::services::ServiceBenchRequest svc;
  std::string svc_spec;
  std::string svc_token_file;
#endif
  strata::bench::StreamBenchRequest sb;
  strata::bench::LongSequenceBenchRequest lb;
  strata::bench::TransferBenchRequest tb;
  strata::bench::AllReduceBenchRequest arb;
  strata::bench::TokenizerBenchRequest tkb;
  strata::bench::ChatTemplateBenchRequest ctb;
  strata::bench::FiguresBenchRequest fb;

  void Register(CLI::App& app, Runner& run) {
    // strata bench ...
    auto* bench = app.add_subcommand("bench", "Benchmarks, each against a peer measured in the same run");
    bench->require_subcommand(1);
    auto* bench_generate = bench->add_subcommand(
        "generate", "Greedy tokens/s of the rollout engine (paged KV cache) vs full recomputation");
    bench_generate->add_option("--layers", gb.layers, "decoder layers");
    bench_generate->add_option("--hidden", gb.hidden, "hidden size");
    bench_generate->add_option("--heads", gb.heads, "attention heads");
    bench_generate->add_option("--kv-heads", gb.kv_heads, "key/value heads");
    bench_generate->add_option("--intermediate", gb.intermediate, "MLP width");
    bench_generate->add_option("--vocab", gb.vocab, "vocabulary size");
    bench_generate->add_option("--batch", gb.batch, "prompts per batch");
    bench_generate->add_option("--prompt-tokens", gb.prompt_tokens, "prompt length");
    bench_generate->add_option("--new-tokens", gb.new_tokens, "tokens generated per prompt");
    bench_generate->add_option("--repeats", gb.repeats, "best of N runs per path");
    bench_generate->add_option("--dtype", gb.dtype, "fp32 | bf16")->check(CLI::IsMember({"fp32", "bf16"}));
    bench_generate->add_flag("--json", gb.json, "print one JSON object");
    bench_generate->callback(
        [&] { run = [&] { return Finish("bench generate", strata::bench::RunGenerateBench(gb)); }; });

    auto* bench_rollout = bench->add_subcommand(
        "rollout", "An RL rollout (n samples + a greedy baseline per prompt) through the engine vs the static loop");
    bench_rollout->add_option("--config", rb.config, "HF config.json of the shape (random weights)");
    bench_rollout->add_option("--model", rb.model, "a model directory (its weights)");
    bench_rollout->add_option("--prompts", rb.prompts, "prompts");
    bench_rollout->add_option("--samples", rb.samples, "sampled continuations per prompt");
    bench_rollout->add_option("--greedy-baseline", rb.greedy_baseline, "also a greedy continuation per prompt (true)");
    bench_rollout->add_option("--min-prompt-tokens", rb.min_prompt_tokens, "shortest prompt");
    bench_rollout->add_option("--max-prompt-tokens", rb.max_prompt_tokens, "longest prompt");
    bench_rollout->add_option("--new-tokens", rb.new_tokens, "max_new_tokens (continuations end at 10-100% of it)");
    bench_rollout->add_option("--kv-block-tokens", rb.kv_block_tokens, "positions per KV block");
    bench_rollout->add_option("--max-concurrency", rb.max_concurrency, "engine sequences at once (0: no limit)");
    bench_rollout->add_option("--dtype", rb.dtype, "fp32 | bf16")->check(CLI::IsMember({"fp32", "bf16"}));
    bench_rollout->add_option("--device", rb.device, "where the model runs: cpu | cuda[:N]");
    bench_rollout
        ->add_option("--steps", rb.steps,
                     "the engine's decode steps: auto (CUDA graphs on a GPU), exact, fixed (their "
                     "fixed shapes without graphs)")
        ->check(CLI::IsMember({"auto", "exact", "fixed"}));
    bench_rollout->add_option("--check-greedy", rb.check_greedy, "decode greedily by both and compare (true)");
    bench_rollout->add_flag("--json", rb.json, "print one JSON object");
    bench_rollout->callback([&] { run = [&] { return Finish("bench rollout", strata::bench::RunRolloutBench(rb)); }; });

    auto* bench_tokenizer =
        bench->add_subcommand("tokenizer", "tokenizer.json load time and encode tokens/s vs Hugging Face tokenizers");
    bench_tokenizer->add_option("--tokenizer", tkb.tokenizer, "a tokenizer.json")->required();
    bench_tokenizer->add_option("--corpus", tkb.corpus, "a JSON array of strings")->required();
    bench_tokenizer->add_option("--reference", tkb.reference, "directory of the peer's encode.mjs (npm-installed)");
    bench_tokenizer->add_option("--repeat", tkb.repeat, "encode the corpus this many times over");
    bench_tokenizer->add_option("--loads", tkb.loads, "best of N loads");
    bench_tokenizer->add_flag("--json", tkb.json, "print one JSON object");
    bench_tokenizer->callback(
        [&] { run = [&] { return Finish("bench tokenizer", strata::bench::RunTokenizerBench(tkb)); }; });

    auto* bench_chat = bench->add_subcommand(
        "chat-template", "Render a JSONL file of conversations through the model's chat template, then tokenize");
    bench_chat->add_option("--tokenizer", ctb.tokenizer, "model dir: tokenizer.json, tokenizer_config.json")
        ->required();
    bench_chat->add_option("--conversations", ctb.conversations, "JSONL, one {\"messages\": [...]} a line")->required();
    bench_chat->add_flag("--json", ctb.json, "print one JSON object (the keys of bench/chat_template_peer.mjs)");
    bench_chat->callback(
        [&] { run = [&] { return Finish("bench chat-template", strata::bench::RunChatTemplateBench(ctb)); }; });

    auto* bench_io = bench->add_subcommand("io", "NVMe store (io_uring, O_DIRECT) vs fio, same size, block and depth");
    bench_io->add_option("--dir", io.dir, "existing directory on the device to measure")->required();
    bench_io->add_option("--size-mib", io.size_mib, "MiB written and read by each side")->check(CLI::PositiveNumber);
    bench_io->add_option("--block-kib", io.block_kib, "I/O size in KiB (multiple of 4)")->check(CLI::PositiveNumber);
    bench_io->add_option("--queue-depth", io.queue_depth, "requests in flight")->check(CLI::PositiveNumber);
    bench_io->add_option("--engine", io.engine, "auto | uring | posix")
        ->check(CLI::IsMember({"auto", "uring", "posix"}));
    bench_io->add_option("--repeats", io.repeats, "runs per side, best counts")->check(CLI::PositiveNumber);
    bench_io->add_flag("--json", io.json, "print one JSON object");
    bench_io->callback([&] { run = [&] { return Finish("bench io", strata::bench::RunIoBench(io)); }; });

    auto* bench_adam = bench->add_subcommand("adam", "CPU AdamW vs torch::optim::AdamW and the DRAM-bandwidth floor");
    bench_adam->add_option("--params", ab.params, "parameters in the tensor")->check(CLI::PositiveNumber);
    bench_adam->add_option("--steps", ab.steps, "timed steps (best counts)")->check(CLI::PositiveNumber);
    bench_adam->add_option("--threads", ab.threads, "threads for all sides (0: all cores)");
    bench_adam->add_option("--bf16-copy", ab.bf16_copy, "also write a bf16 copy of the weights (true|false)");
    bench_adam->add_option("--isa", ab.isa, "auto | scalar | avx2 | avx512")
        ->check(CLI::IsMember({"auto", "scalar", "avx2", "avx512"}));
    bench_adam->add_flag("--json", ab.json, "print one JSON object");
    bench_adam->callback([&] { run = [&] { return Finish("bench adam", strata::bench::RunAdamBench(ab)); }; });

#if STRATA_WITH_SERVICE
    auto* bench_service = bench->add_subcommand("service", "Concurrent clients against a running coordinator");
    bench_service->add_option("--addr", svc.addr, "coordinator HOST:PORT");
    bench_service->add_option("--token-file", svc_token_file, "bearer token file (default $STRATA_TOKEN)");
    bench_service->add_option("--redis", svc.redis, "redis://HOST:PORT of the same stack, for the peer figures");
    bench_service->add_option("--spec", svc_spec, "job spec each client submits")->required();
    bench_service->add_option("--clients", svc.clients, "concurrent clients");
    bench_service->add_option("--seconds", svc.seconds, "how long the clients run");
    bench_service->add_flag("--json", svc.json, "print one JSON object");
    bench_service->callback([&] {
      run = [&] {
        auto spec = strata::ReadFileToString(svc_spec);
        if (!spec.ok()) return Finish("bench service", spec.status());
        auto token = strata::services::ResolveToken(svc_token_file);
        if (!token.ok()) return Finish("bench service", token.status());
        svc.spec_yaml = *spec;
        svc.token = *token;
        return Finish("bench service", strata::services::RunServiceBench(svc));
      };
    });
#endif

    auto* bench_long = bench->add_subcommand(
        "long", "Training step over one long sequence: materialised vs blocked attention, activations kept vs off");
    bench_long->add_option("--config", lb.config, "config.json of the shape (random weights)")->required();
    bench_long->add_option("--layers", lb.layers, "decoder layers (0: the config's)");
    bench_long->add_option("--dtype", lb.dtype, "fp32 or bf16");
    bench_long->add_option("--lora-rank", lb.lora_rank,
                           "train LoRA adapters of this rank on every projection (0: off)");
    bench_long->add_option("--tokens", lb.tokens, "sequence lengths")->delimiter(',');
    bench_long->add_option("--modes", lb.modes, "of materialised, blocked, fused, host, nvme")->delimiter(',');
    bench_long->add_option("--device", lb.device, "cpu, cuda or cuda:N");
    bench_long->add_option("--max-scores-bytes", lb.max_scores_bytes, "skip materialised attention beyond this");
    bench_long->add_option("--nvme-dir", lb.nvme_dir, "directory for NVMe activations");
    bench_long->add_option("--steps", lb.steps, "timed steps per mode (best reported)");
    bench_long->add_option("--warmup", lb.warmup, "untimed steps first");
    bench_long->add_flag("--json", lb.json, "print one JSON object");
    bench_long->callback([&] { run = [&] { return Finish("bench long", strata::bench::RunLongSequenceBench(lb)); }; });

    auto* bench_stream = bench->add_subcommand("stream",
                                               "Training step with layers streamed from host / NVMe vs resident");
    bench_stream->add_option("--layers", sb.layers, "decoder layers");
    bench_stream->add_option("--hidden", sb.hidden, "hidden size (multiple of 64)");
    bench_stream->add_option("--vocab", sb.vocab, "vocabulary size");
    bench_stream->add_option("--batch", sb.batch, "sequences per step");
    bench_stream->add_option("--seq", sb.seq, "tokens per sequence");
    bench_stream->add_option("--device-budget-mib", sb.device_budget_mib,
                             "device budget (0: the streamed step's own estimate + 10%)");
    bench_stream->add_option("--prefetch", sb.prefetch_depth, "layers prefetched ahead");
    bench_stream->add_option("--nvme-dir", sb.nvme_dir, "directory for the NVMe tier");
    bench_stream->add_option("--steps", sb.steps, "timed steps per mode (best reported)");
    bench_stream->add_option("--device", sb.device, "compute device: cpu, cuda or cuda:N");
    bench_stream->add_flag("--json", sb.json, "print one JSON object");
    bench_stream->callback([&] { run = [&] { return Finish("bench stream", strata::bench::RunStreamBench(sb)); }; });

    auto* bench_figures = bench->add_subcommand(
        "figures", "This machine's figures for `strata plan` (matmul, copies, NVMe, CPU Adam, all-reduce, RSS)");
    bench_figures->add_option("--nvme-dir", fb.nvme_dir, "existing directory on the NVMe tier's disk")->required();
    bench_figures->add_option("--out", fb.out, "figures file to write (default: ~/.cache/strata/figures.json)");
    bench_figures->add_option("--machine", fb.machine, "free text naming the machine, kept in the file");
    bench_figures->add_flag("--quick", fb.quick, "a smaller grid (seconds instead of a minute)");
    bench_figures->callback([&] {
      run = [&] {
        if (fb.out.empty()) fb.out = strata::services::DefaultFiguresPath();
        if (!fb.out.empty()) std::filesystem::create_directories(std::filesystem::path(fb.out).parent_path());
        return Finish("bench figures", strata::bench::RunFiguresBench(fb));
      };
    });
    auto* bench_allreduce = bench->add_subcommand(
        "allreduce", "Gradient all-reduce over 2 ranks: strata's bucketed path vs bare c10d Gloo; step wait share");
    bench_allreduce->add_option("--config", arb.config, "HF config.json of the model shape");
    bench_allreduce->add_option("--ranks", arb.ranks, "ranks (threads over loopback)");
    bench_allreduce->add_option("--batch", arb.batch, "sequences per rank in the training step");
    bench_allreduce->add_option("--seq", arb.seq, "tokens per sequence");
    bench_allreduce->add_option("--steps", arb.steps, "timed repetitions (best reported)");
    bench_allreduce->add_option("--dtype", arb.dtype, "weights of the training step's model: fp32 or bf16")
        ->check(CLI::IsMember({"fp32", "bf16"}));
    bench_allreduce->add_flag("--json", arb.json, "print one JSON object");
    bench_allreduce->callback(
        [&] { run = [&] { return Finish("bench allreduce", strata::bench::RunAllReduceBench(arb)); }; });

    auto* bench_transfer =
        bench->add_subcommand("transfer", "Host<->device copy bandwidth: pinned arena vs torch pinned tensor copy");
    bench_transfer->add_option("--device", tb.device, "cuda, cuda:N, or cpu (plumbing check)");
    bench_transfer->add_option("--size-mib", tb.size_mib, "bytes per copy, in MiB");
    bench_transfer->add_option("--repeats", tb.repeats, "timed copies per side and direction (median counts)");
    bench_transfer->add_flag("--json", tb.json, "print one JSON object");
    bench_transfer->callback(
        [&] { run = [&] { return Finish("bench transfer", strata::bench::RunTransferBench(tb)); }; });
  }
};

}  // namespace

int main(int argc, char** argv) {
  // Before the first tensor: freed tensors go back to the kernel, so peak
  // RSS is what the job holds, less a bounded kept heap top (base/heap.h).
  strata::ConfigureHeap();
  // A peer that dies mid-write (a Gloo rank, whose transport writes with
  // writev, or a reward server) must be an error on that call, reported and
  // recovered from, not a SIGPIPE that ends this process without a word.
  std::signal(SIGPIPE, SIG_IGN);
  CLI::App app{"strata: RLHF training service (ReMax, PPO) with tiered GPU/CPU/NVMe memory"};
  // Subcommands are checked after parsing, so that an unknown one is named
  // in the error rather than reported as "a subcommand is required".
  app.require_subcommand(0, 1);
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "debug | info | warning | error")
      ->check(CLI::IsMember({"debug", "info", "warning", "error"}));

  // The parsed subcommand's callback sets `run`; the groups own the flags'
  // values, so they live as long as `app`.
  Runner run;
  ModelCommands model;
  model.Register(app, run);
  TrainCommands train;
  train.Register(app, run);
#if STRATA_WITH_SERVICE
  ServerCommands servers;
  servers.Register(app, run);
  ClientCommands clients;
  clients.Register(app, run);
#endif
  ReportCommands reports;
  reports.Register(app, run);
  BenchCommands benches;
  benches.Register(app, run);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (app.get_subcommands().empty()) {
    std::fprintf(stderr, "%s\nstrata: a subcommand is required\n", app.help().c_str());
    return 1;
  }
  strata::LogLevel level;
  if (strata::ParseLogLevel(log_level, &level)) strata::SetMinLogLevel(level);
  try {
    return run ? run() : 0;
  } catch (const std::exception& e) {
    // libtorch reports shape and dtype problems by throwing.
    std::fprintf(stderr, "strata: INTERNAL: %s\n", e.what());
    return 1;
  }
}
