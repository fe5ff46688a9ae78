#pragma once
// Upper bounds on every size and count a user gives (deck, token file, checkpoint, command line),
// each with its reason. They are far above any model anyone trains, and low enough that no
// product of them overflows the int the ops take (B*T, 4*C, the padded vocabulary) before the
// memory check sees what the run needs.
#include <cstdint>

namespace tessera::limits {

// The deepest published GPTs have ~100 layers.
inline constexpr int kLayers = 1024;
inline constexpr const char* kLayersWhy = "the deepest published GPTs have about 100";
// The widest published models use 12288-25600.
inline constexpr int kEmbd = 65536;
inline constexpr const char* kEmbdWhy = "the widest published models use 12288-25600";
// A LLaMA MLP's hidden width (GPT-2's is 4 n_embd, inside 4 kEmbd).
inline constexpr int kFfn = 1 << 18;
inline constexpr const char* kFfnWhy = "the widest published MLPs have 53248 (Llama 3 405B)";
// Experts of a mixture-of-experts layer (DeepSeek-V3: 256 routed, Llama 4 Maverick: 128).
inline constexpr int kExperts = 4096;
inline constexpr const char* kExpertsWhy = "the most in a published model is 256 (DeepSeek-V3)";
// Rows of the learned position table; attention memory grows as its square.
inline constexpr int kBlock = 1 << 20;
inline constexpr const char* kBlockWhy = "a learned position table of 1M rows";
// The largest vocabularies in use have ~256k tokens; token files hold uint16 or uint32 ids.
inline constexpr int64_t kVocab = 1 << 24;
inline constexpr const char* kVocabWhy = "the largest vocabularies in use have about 256k tokens";
// Padding wte beyond this only wastes rows; with kVocab the padded size stays an int.
inline constexpr int kVocabMultiple = 1 << 16;
inline constexpr const char* kVocabMultipleWhy = "padding wte further only wastes memory";
// Tokens per step: the ops index a step's B*T positions with an int.
inline constexpr int64_t kStepTokens = (int64_t(1) << 31) - 1;
inline constexpr const char* kStepTokensWhy = "the ops count a step's positions in an int";
// Steps read ahead by the loader: a few hide any disk's latency.
inline constexpr int kPrefetch = 256;
inline constexpr const char* kPrefetchWhy = "a few steps hide any disk's latency";
// Loader threads per rank.
inline constexpr int kReaders = 256;
inline constexpr const char* kReadersWhy = "more threads than any disk has queues";
// OpenMP threads per rank: more than any node has cores (the runtime fails to start them).
inline constexpr int kThreads = 1024;
inline constexpr const char* kThreadsWhy = "more than any node has cores";
// Head sizes (n_embd / n_head) of model.attention: fused: the CUDA kernel's tiles hold up to 128.
inline constexpr int kFusedHeadSize = 128;
// A deck is a few KB; the limit keeps a wrong path (a log, a device) from being read whole.
inline constexpr int64_t kDeckBytes = 1 << 20;
// A serialized sentencepiece model is a few MB.
inline constexpr int64_t kTokenizerModelBytes = int64_t(1) << 30;
// A Hugging Face tokenizer.json: the largest byte-level BPE files published (BLOOM's 250k
// tokens, Qwen's 151k) are 7-15 MB; nlohmann::json holds one in about ten times its size.
inline constexpr int64_t kTokenizerJsonBytes = int64_t(64) << 20;
inline constexpr const char* kTokenizerJsonBytesWhy =
    "the largest published byte-level BPE tokenizer.json files are about 15 MB";
// Nesting of a JSON file tessera reads (tokenizer.json nests 5 deep). Bounded because copying,
// comparing or printing a JSON value recurses once per level.
inline constexpr int kJsonDepth = 128;
// Pre-tokenizer steps of a tokenizer.json (Split patterns and ByteLevel): each is one more regular
// expression every piece of text goes through.
inline constexpr int kPreTokenizerSteps = 64;
inline constexpr const char* kPreTokenizerStepsWhy = "published tokenizers chain at most 4";
// tessera sample --tokens: each token is a forward pass.
inline constexpr int64_t kSampleTokens = int64_t(1) << 30;

}  // namespace tessera::limits
