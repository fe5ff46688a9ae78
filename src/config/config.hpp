#pragma once
// The input deck: YAML -> typed Config. Every key has a default or is required; every key is
// documented in input/README.md. Errors are UserError("deck.yaml:LINE:COL: key: problem").
#include <cstdint>
#include <string>
#include <vector>

namespace tessera {

// The deck's words, typed where the deck is read: config/keys.cpp spells each (deck_word), and no
// code outside config/ compares a deck value with a string (tests/layering/check.py).
enum class Arch { Gpt2, Llama };       // model.arch (model/family.hpp: the two families)
enum class Tie { Auto, True, False };  // model.tie_embeddings
enum class Attention { Gemm, Fused };  // model.attention
// train.recompute: which activations the backward recomputes instead of keeping.
//   None       every layer's activations are kept from the forward
//   Selective  the attention core (probabilities or log-sum-exp, and its output) is recomputed
//              from the kept q, k, v, as Megatron-LM's selective recompute
//   Full       only each layer's input is kept; the backward reruns the layer's forward first
enum class Recompute { None, Selective, Full };
enum class AnomalyAction { Stop, Skip, Rollback };  // train.anomaly_action
enum class DeviceBackend { Cpu, Cuda, Auto };       // device.backend
enum class Precision { Fp32, Bf16, Fp8 };           // device.precision
enum class Fp8Recipe { Hybrid, E4M3 };              // device.fp8_format
enum class AmaxAlgo { Max, MostRecent };            // device.fp8_amax_algo
enum class ExpertGemm { Loop, Grouped };            // device.expert_gemm
// parallel.schedule. GPipe: all forwards 0..m-1, then all backwards in reverse order m-1..0.
// OneFOneB: PipeDream-Flush / Megatron 1F1B; with virtual_stages > 1 Megatron's interleaved 1F1B
// (there is no "interleaved" word: one key, parallel.virtual_stages, turns it on).
enum class ScheduleKind { GPipe, OneFOneB };
enum class CpComm { Ring, AllGather };  // parallel.cp_comm
enum class OptimRule { AdamW, Adafactor };  // optim.name (optim/rule.hpp)
enum class MoeScore { Softmax, Sigmoid };   // model.moe.score (backend/moe_routing.hpp)
// log.breakdown: time the ops by kind; auto: where their cost is measured (the CPU), not on a GPU.
enum class Breakdown { Auto, On, Off };
// data.windows: where training windows start; stride: every T tokens; documents: at each document's
// start (the token file's /document_offsets index).
enum class Windows { Stride, Documents };

// The deck's spelling of each word ("fused", "1f1b"), for logs and messages.
const char* deck_word(Arch v);
const char* deck_word(Tie v);
const char* deck_word(Attention v);
const char* deck_word(Recompute v);
const char* deck_word(AnomalyAction v);
const char* deck_word(DeviceBackend v);
const char* deck_word(Precision v);
const char* deck_word(Fp8Recipe v);
const char* deck_word(AmaxAlgo v);
const char* deck_word(ExpertGemm v);
const char* deck_word(ScheduleKind v);
const char* deck_word(CpComm v);
const char* deck_word(OptimRule v);
const char* deck_word(MoeScore v);
const char* deck_word(Windows v);

// model.moe: a mixture-of-experts MLP (a router and `experts` copies of the family's MLP, each
// token through top_k of them) in place of the dense MLP of some layers; written as a map under
// model (`model.moe.experts` on the command line). experts = 0: a dense model, and every other
// moe key is a deck error.
struct MoeConfig {
  int experts = 0;           // E routed experts of each MoE layer
  int top_k = 2;             // the experts each token goes to, 1 <= top_k <= experts
  int ffn = 0;               // each expert's MLP width; 0 = the dense MLP's (model.ffn_hidden)
  int shared_experts = 0;    // experts of width ffn every token also goes through (DeepSeek, Qwen2)
  // Which layers: layer l (0-based) is an MoE layer when l >= first_dense and (l + 1) is a
  // multiple of every (Qwen's decoder_sparse_step; DeepSeek-V3's first_k_dense_replace).
  int every = 1;
  int first_dense = 0;
  MoeScore score = MoeScore::Softmax;  // the router's scores: softmax | sigmoid
  bool renormalize = true;   // the chosen top_k gates divided by their sum
  double aux_loss = 0.01;    // the Switch/GShard load-balancing loss's coefficient; 0 = none
  double z_loss = 0;         // the router z-loss's coefficient (ST-MoE); 0 = none
  // DeepSeek-V3's auxiliary-loss-free balancing: each step every expert's selection bias moves by
  // this much toward the mean load (down when over, up when under); 0 = no bias.
  double bias_rate = 0;
  // Dropless when absent (0); else each expert takes at most ceil(factor N top_k / experts) of a
  // micro-batch's N tokens, the latest dropped (counted in the log).
  double capacity_factor = 0;
};

struct ModelConfig {
  Arch arch = Arch::Gpt2;    // gpt2 | llama (model/param_layout.hpp)
  int n_layer = 4;
  int n_head = 4;
  int n_kv_head = 0;         // key/value heads (grouped-query attention); 0 = n_head
  int n_embd = 128;
  int ffn_hidden = 0;        // MLP width; 0 = 4 n_embd (gpt2), 8 n_embd / 3 rounded up (llama)
  int ffn_multiple = 256;    // llama's default ffn_hidden is rounded up to a multiple of this
  int block_size = 256;      // rows of wpe: the longest sequence the model can take
  int vocab_size = 0;        // 0: the training data's vocab_size attribute
  int vocab_multiple = 64;   // wte rows are padded to a multiple of this (Vp)
  double init_std = 0.02;
  Attention attention = Attention::Gemm;  // gemm (T x T probabilities kept) | fused (flash-style)
  Tie tie_embeddings = Tie::Auto;  // auto (gpt2: true, llama: false) | true | false
  double norm_eps = 1e-5;    // llama's RMSNorm epsilon (GPT-2's LayerNorm: 1e-5)
  double rope_theta = 10000.0;  // llama's rotary base
  // llama only: each head's q and k RMS-normalised (weight of head size, eps norm_eps) before the
  // rotary embedding, as Qwen3's attention (q_norm, k_norm)
  bool qk_norm = false;
  MoeConfig moe;
};

struct DataConfig {
  std::string train;         // required: a token source, or a blend "W1 SRC1 W2 SRC2 ..."
  std::string val;           // "" = no validation
  std::string format = "auto";  // auto | hdf5 | llmc | megatron | raw
  std::string dtype = "uint16";  // raw files: uint16 | uint32
  int seq_len = 128;         // T, must be <= model.block_size
  int prefetch = 4;          // steps read ahead by the loader threads; 0 = read in the step
  int readers = 4;           // loader threads, each reading whole steps
  bool direct_io = true;     // O_DIRECT reads where the file system allows them
  bool check_tokens = true;  // scan every token id against the vocabulary before training
  bool trace = false;        // <run.dir>/data_trace.rankN.txt: the token ids of every sample
  // Attention causal within documents only: a token sees the tokens of its own document (those
  // after the last end-of-text before it), not the tail of the one before.
  bool document_mask = false;
  Windows windows = Windows::Stride;
};

struct TrainConfig {
  int steps = 1000;
  int batch_size = 16;       // global sequences per optimizer step
  int micro_batch = 0;       // sequences per forward/backward per dp rank; 0 = batch_size / dp
  uint64_t seed = 1337;
  Recompute recompute = Recompute::None;  // none | selective | full
  // The anomaly policy (train/anomaly.hpp): a non-finite loss or gradient norm, or with sigma > 0
  // one above the running mean + sigma x std of the last `window` steps, is met by `action`.
  int anomaly_window = 50;
  double anomaly_sigma = 0;        // 0 = non-finite values only
  AnomalyAction anomaly_action = AnomalyAction::Stop;  // stop | skip | rollback
  // Rollbacks landing on one checkpoint (and 5 x as many in all) before the run stops, exit 4.
  int anomaly_max_rollbacks = 3;
};

struct OptimConfig {
  double lr = 1e-3;
  double min_lr = 1e-4;
  int warmup_steps = 0;
  int decay_steps = 0;       // cosine reaches min_lr here; 0 = train.steps
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double grad_clip = 1.0;    // 0 = off
  // The update rule (optim/rule.hpp): adamw | adafactor. beta1 is both rules' first moment
  // (Adafactor: 0 = none kept); beta2 and eps are AdamW's; the adafactor_* keys Adafactor's.
  OptimRule name = OptimRule::AdamW;
  double adafactor_eps = 1e-30;    // added to the mean squares (Adafactor's eps1)
  double adafactor_decay = -0.8;   // beta2 at step t: 1 - t^adafactor_decay
  double adafactor_clip = 1.0;     // the update's RMS is clipped to this
  // A restart from a checkpoint whose optimizer state the rule cannot take (another rule's, or
  // without a tensor it needs) starts the rule's state afresh instead of stopping.
  bool reset_state = false;
};

struct EvalConfig {
  int every = 0;             // 0 = only after the last step
  int batches = 8;
};

struct CheckpointConfig {
  std::string dir;           // "" = <run.dir>/checkpoints
  int every = 0;             // 0 = only after the last step
  std::string restart = "auto";  // auto | none | PATH (restart_from says which)
  int collective_bytes = 1 << 20;  // tensors this large or larger use collective MPI-IO transfers
  std::string init_from;     // "" = none; else a checkpoint whose weights start a fresh run
  bool reserve = true;       // fallocate a checkpoint's size before writing it: a full disk is found
                             // before a byte is written
  int keep = 0;              // complete checkpoints kept (older ones removed); 0 = all
  bool async = false;        // written by a background thread from a host snapshot
};

// checkpoint.restart: the newest checkpoint of the run (auto), none, or the file or directory
// it names.
enum class RestartFrom { Auto, None, Path };
RestartFrom restart_from(const CheckpointConfig& c);

struct LogConfig {
  int every = 10;
  double peak_gflops = 0;    // 0 = measure sgemm at start-up, as `make bench` does
  Breakdown breakdown = Breakdown::Auto;  // time the ops by kind (backend/op_clock.hpp)
};

struct RunConfig {
  std::string dir = "runs/default";
  double max_minutes = 0;    // wall-time budget: checkpoint and exit 3 before it runs out; 0 = none
  double hang_timeout = 0;   // seconds without progress before the watchdog ends the job; 0 = off
};

struct DeviceConfig {
  DeviceBackend backend = DeviceBackend::Cpu;  // cpu | cuda | auto
  // fp32 | bf16 (CUDA: bf16 parameters/activations, fp32 master) | fp8 (the linear layers'
  // GEMMs on FP8 inputs with delayed scaling; simulated on the CPU, model/fp8.hpp)
  Precision precision = Precision::Fp32;
  int threads = 0;              // OpenMP threads; 0 = the runtime's default (OMP_NUM_THREADS)
  // CUDA: the data-parallel sums and ZeRO gathers on NCCL streams of their own, beside the
  // compute stream's work (false: every collective on the compute stream, for a cluster where two
  // NCCL communicators in flight at once hang).
  bool nccl_overlap = true;
  // CUDA, mixture of experts: the routed experts' GEMMs one cuBLAS call per expert (loop) or one
  // cublasGemmGroupedBatchedEx per product over the rank's experts (grouped).
  ExpertGemm expert_gemm = ExpertGemm::Loop;
  // precision fp8 only (a deck error otherwise): the recipe of Transformer Engine's delayed
  // scaling. hybrid: E4M3 forward (weights, activations), E5M2 output gradients; e4m3: E4M3 for
  // all three. Each tensor's scale is (max of the format / amax) / 2^margin, amax the largest of
  // the last fp8_amax_history steps' (max) or the last one's (most_recent).
  Fp8Recipe fp8_format = Fp8Recipe::Hybrid;
  int fp8_amax_history = 16;
  AmaxAlgo fp8_amax_algo = AmaxAlgo::Max;  // max | most_recent
  int fp8_margin = 0;
  bool fp8_head = false;  // the LM head's GEMM in FP8 too
};

struct ParallelConfig {
  int dp = 1;                     // data-parallel ranks; 0 = auto (world size / (tp * pp))
  int tp = 1;                     // tensor-parallel ranks; 0 = auto
  int pp = 1;                     // pipeline stages; 0 = auto
  ScheduleKind schedule = ScheduleKind::OneFOneB;  // gpipe | 1f1b
  // ZeRO stage (optim/distributed.hpp): 0 none, 1 optimizer state, 2 and gradients, 3 and
  // parameters sharded over the data-parallel group, or over groups of zero_group consecutive dp
  // ranks (zero_group below).
  int zero = 0;
  std::vector<int> stage_layers;  // layers per stage (sums to n_layer); empty = balanced
  bool sequence_parallel = false; // norms and residuals split along the sequence over tp
  int virtual_stages = 1;         // layer chunks per pipeline rank (interleaved 1F1B when > 1)
  int zero_group = 0;             // hybrid sharding: ZeRO over groups of this many dp ranks; 0 = dp
  // ZeRO-3: a layer's parameters are gathered again for its backward (true), or kept from its
  // forward until the step's end (false: more memory, a third less communication).
  bool reshard_after_forward = true;
  // ZeRO-3: the next unit's gather starts while this one computes (false: each unit is gathered
  // when the model asks for it; for measuring the overlap).
  bool zero_prefetch = true;
  int cp = 1;                     // context-parallel ranks: each sequence split over them
  // Expert parallelism: each MoE layer's experts split over ep ranks carved from dp x cp (the
  // dense weights stay replicated over dp x cp, the experts' over dp x cp / ep).
  int ep = 1;
  // The experts' split over tp: 0 (or tp) as the dense MLP's; 1 = whole experts on every tp
  // rank, each routing its own sequence-parallel rows, the ep groups folded over tp x dp x cp
  // (Megatron's expert tensor parallelism 1 with parallel folding).
  int expert_tp = 0;
  CpComm cp_comm = CpComm::Ring;  // ring | allgather: how attention's K/V reach the cp ranks
};

struct Config {
  ModelConfig model;
  DataConfig data;
  TrainConfig train;
  OptimConfig optim;
  EvalConfig eval;
  CheckpointConfig checkpoint;
  LogConfig log;
  RunConfig run;
  DeviceConfig device;
  ParallelConfig parallel;
  std::string deck_path;        // as given on the command line; "" when parsed from text
};

// Reads the deck file, applies "section.key=value" overrides (in order), validates, and returns
// the Config. Throws UserError (exit 2) naming "file:line:col: key: problem"; an override error
// names "command line: section.key=value: problem". A missing or unreadable file is exit 1.
Config load_deck(const std::string& path, const std::vector<std::string>& overrides);

// The same from YAML text; `origin` stands in for the file name in messages.
Config parse_deck(const std::string& yaml_text, const std::string& origin,
                  const std::vector<std::string>& overrides);

// The fully resolved deck (every key, defaults filled in) as YAML text, loadable by parse_deck.
std::string to_yaml(const Config& config);

}  // namespace tessera
