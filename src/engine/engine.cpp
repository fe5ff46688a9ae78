#include "engine/engine.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <utility>

#include "backend/cpu/backend.hpp"
#include "common/error.hpp"
#include "engine/engine_memory.hpp"
#include "engine/sequences.hpp"
#include "io/eval_data.hpp"
#include "model/gpt.hpp"
#include "optim/clip.hpp"
#include "optim/distributed.hpp"
#include "pipeline/executor.hpp"
#ifdef TESSERA_CUDA
#include "backend/cuda/backend.hpp"
#endif

namespace tessera {

namespace {

template <class Backend>
class Engine final : public TrainEngine {
  using Act = typename Backend::Act;
  static constexpr bool kBf16 = !std::is_same_v<Act, float>;

 public:
  Engine(const EngineSetup& s, bool allocate_now)
      : tile_(s.tile), mb_(s.micro_batch), T_(s.seq_len),
        cp_size_(s.mesh ? s.mesh->size("cp") : 1), cp_rank_(s.mesh ? s.mesh->coord("cp") : 0),
        embed_sum_(s.embed_sum), prefetch_(s.zero_prefetch),
        arena_(Backend::memory()),
        // The groups, made in a fixed order (an NCCL communicator's construction is collective
        // over its ranks). The data-parallel sums, the ZeRO group's gathers and the cp ring's
        // transfers (each posted before the attention block in hand) overlap the compute that
        // follows them (device.nccl_overlap).
        tp_(group(s, {"tp"})), dp_(group(s, {"dp", "cp"}), s.nccl_overlap),
        pp_(group(s, {"pp"})), embed_(s.mesh ? s.mesh->embed() : MPI_COMM_NULL),
        own_shard_(hybrid(s) ? group(s, {"shard"}) : MPI_COMM_NULL, s.nccl_overlap),
        replica_(hybrid(s) ? group(s, {"replica"}) : MPI_COMM_NULL),
        cp_(group(s, {"cp"}), s.nccl_overlap), world_(s.mesh ? s.mesh->world() : MPI_COMM_NULL),
        ep_(experts_split(s) ? group(s, {"ep"}) : MPI_COMM_NULL),
        own_edp_(experts_split(s) ? group(s, {"eshard", "ereplica"}) : MPI_COMM_NULL),
        own_eshard_(experts_split(s) && hybrid(s) ? group(s, {"eshard"}) : MPI_COMM_NULL),
        shard_(hybrid(s) ? &own_shard_ : &dp_), edp_(experts_split(s) ? &own_edp_ : &dp_),
        eshard_(experts_split(s) && hybrid(s) ? &own_eshard_ : edp_),
        mem_(s, arena_, {&tp_, &dp_, &pp_, shard_, &replica_, &cp_, &ep_, edp_, eshard_},
             &world_),
        models_(mem_.models), optimizer_(mem_.optimizer), executor_(mem_.executor) {
    step_tokens_ = mem_.step_tokens;
    // The step breakdown's op clock (log.breakdown): host clocks time a host backend's
    // synchronous ops, events a GPU's queued ones; auto: on where its cost is measured (the CPU).
    const bool timed = s.breakdown == Breakdown::On ||
                       (s.breakdown == Breakdown::Auto && Backend::kHostMemory);
    Backend::op_events(timed);
    op_clock::enable(timed);
    if (cp_size_ > 1) staging_.resize(2 * step_tokens_);
    if (s.model.document_mask) {
      if (s.document_eot < 0)
        throw std::logic_error("data.document_mask without the data's end-of-text id");
      document_eot_ = s.document_eot;
      doc_full_.resize(2 * step_tokens_ * size_t(cp_size_));
      if (cp_size_ > 1) doc_own_.resize(2 * step_tokens_);
    }
    if (allocate_now) allocate();
  }

  size_t host_bytes() const override { return mem_.host_bytes(arena_, Backend::kHostMemory); }

  void allocate() override {
    arena_.allocate();
    for (auto& model : models_) model->bind();
    optimizer_.bind();
    executor_.bind();
    master_ = arena_.get<float>(mem_.h_master);
    grads_ = arena_.get<float>(mem_.h_grads);
    if constexpr (kBf16) copy_ = arena_.get<Act>(mem_.h_copy);
    tokens_ = arena_.get<int32_t>(mem_.h_tokens);
    if (document_eot_ >= 0) doc_start_ = arena_.get<int32_t>(mem_.h_doc_start);
    targets_ = arena_.get<int32_t>(mem_.h_targets);
    losses_ = arena_.get<float>(mem_.h_losses);
    host_losses_.resize(step_tokens_);
    if (mem_.sharded) {
      sharded_own_ = std::make_unique<ShardedWeights<Backend>>(
          tile_, mem_.plan, *mem_.sharded, shard_, eshard_, optimizer_.stage(), prefetch_, arena_);
      sharded_ = sharded_own_.get();
      // ZeRO-2 gathers from the full parameters, ZeRO-3 from this rank's parts of them.
      sharded_->bind(model_params(), grads_);
      // Sequence parallelism's partial norm gradients, summed over tp in the unit's buffer
      // before its reduce-scatter: each unit's ranges, relative to its start.
      std::vector<std::vector<std::pair<size_t, size_t>>> partial(tile_.units.size());
      auto add = [&](int l) {
        for (const auto& [begin, end] : models_.front()->tp_partial_gradients(l)) {
          const int u = tile_.unit_of_tensor[size_t(tensor_at(begin))];
          partial[size_t(u)].emplace_back(begin - tile_.units[size_t(u)].begin, end - begin);
        }
      };
      add(-1);
      for (const LayerRange& chunk : tile_.chunks)
        for (int l = chunk.begin; l < chunk.end; ++l) add(l);
      sharded_->before_reduce = [this, partial](int u, float* grads) {
        for (const auto& [at, n] : partial[size_t(u)]) tp_.all_reduce_sum(grads + at, n);
      };
      // FP8: a layer's weights gathered as codes, each rank casting its part with the scale of
      // the chunk holding the layer.
      if (!mem_.sharded->codes.empty())
        sharded_->cast_codes = [this](int layer, int gemm, const Act* x, size_t n, uint8_t* out) {
          for (auto& model : models_)
            if (model->fp8() != nullptr && model->fp8()->covers(layer))
              return model->fp8()->cast_part(layer, gemm, x, n, out, shard_);
          throw std::logic_error("ZeRO-3: no model chunk holds FP8 layer " + std::to_string(layer));
        };
    }
    if (!mem_.host_state_is_master(Backend::kHostMemory))
      host_params_.assign(optimizer_.state_size(), 0.0f);
  }

  size_t state_size() const override { return optimizer_.state_size(); }
  const LocalLayout& state_layout() const override { return optimizer_.state_layout(); }
  // ep: the first edp group's ranks write their experts, ep rank 0 the rest (model/shard.hpp).
  bool writes_state() const override {
    return optimizer_.by_parts() ? replica_.rank() == 0 : edp_->rank() == 0;
  }
  size_t moment_bytes() const override { return optimizer_.moment_bytes(); }
  Footprint footprint() const override {
    return {mem_.param_bytes(arena_), arena_.bytes(mem_.h_grads), optimizer_.declared_bytes(),
            mem_.transient_bytes(), arena_.total_bytes(), executor_.send_buffer_bytes()};
  }
  size_t activation_bytes() const override { return mem_.activation_bytes(); }
  std::string memory_report() const override { return Backend::memory_report(arena_, kBf16); }
  std::string fp8_report() const override { return Backend::fp8_report(); }
  double peak_gflops(bool fp8) const override { return Backend::peak_gflops(kBf16, fp8); }
  Allocator loader_memory() const override { return Backend::loader_memory(); }

  // Where the master weights are host memory laid out as the state, they are the host
  // parameters: nothing to copy.
  float* host_params() override {
    return host_params_.empty() ? master_ : host_params_.data();
  }
  void params_to_device() override {
    if (host_params_.empty()) return;
    const float* host = host_params_.data();
    if (parts_in_full()) {
      // This rank's parts into the full parameters (the master itself in fp32, else the bf16
      // copy beside the parts' master), then every rank's parts gathered.
      if constexpr (kBf16) Backend::to_device(master_, host, host_params_.size() * sizeof(float));
      each_part([&](size_t local, size_t state, size_t n) {
        if constexpr (kBf16) {
          const std::vector<Act> rounded(host + state, host + state + n);
          Backend::to_device(copy_ + local, rounded.data(), n * sizeof(Act));
        } else {
          Backend::to_device(master_ + local, host + state, n * sizeof(float));
        }
      });
      if (stage() == 2) sharded_->gather_full(full_params());
      else optimizer_.gather_parts(optimizer_.master_sharded() ? nullptr : master_, copy_);
      return;
    }
    const size_t n = host_params_.size();
    // ZeRO-1 in bf16: this rank's slice of the master, the whole copy.
    if (optimizer_.master_sharded())
      Backend::to_device(master_, host + optimizer_.shard_begin(),
                         optimizer_.shard_elements() * sizeof(float));
    else
      Backend::to_device(master_, host, n * sizeof(float));
    if constexpr (kBf16) {
      // Rounded to nearest even, as adamw_update rounds the copy it refreshes.
      std::vector<Act> rounded(host_params_.begin(), host_params_.end());
      Backend::to_device(copy_, rounded.data(), n * sizeof(Act));
    }
  }
  float* params_to_host() override {
    if (host_params_.empty()) return master_;
    if (parts_in_full() && !kBf16) {
      each_part([&](size_t local, size_t state, size_t n) {
        Backend::to_host(host_params_.data() + state, master_ + local, n * sizeof(float));
      });
    } else if (stage() == 1 && !optimizer_.by_parts() && optimizer_.master_sharded()) {
      // Each rank's slice of the master, gathered over the ZeRO group on the host.
      const size_t slice = optimizer_.shard_elements();
      Backend::to_host(host_params_.data() + optimizer_.shard_begin(), master_,
                       slice * sizeof(float));
      MPI_Allgather(MPI_IN_PLACE, int(slice), MPI_FLOAT, host_params_.data(), int(slice),
                    MPI_FLOAT, shard_->mpi());
    } else {
      Backend::to_host(host_params_.data(), master_, host_params_.size() * sizeof(float));
    }
    return host_params_.data();
  }
  std::string optim_rule() const override { return optimizer_.rule(); }
  const std::vector<StateSpec>& optim_state() const override { return optimizer_.state_specs(); }
  void get_optim_state(std::vector<std::vector<float>>& host) override {
    optimizer_.get_state(host);
  }
  void set_optim_state(const std::vector<std::vector<float>>& host) override {
    optimizer_.set_state(host);
  }
  long optim_first_step() const override { return optimizer_.first_step(); }
  void set_optim_first_step(long step) override { optimizer_.set_first_step(step); }

  StepResult train_step(const std::vector<HostMicroBatch>& batches, float dloss, double grad_clip,
                        double lr, long t, const StepCheck& check) override {
    for (auto& model : models_) model->poison_transient();
    for (auto& model : models_)
      if (MoeLayer<Backend>* moe = model->moe())
        std::fill(moe->step_loads().begin(), moe->step_loads().end(), 0.0);
    const std::vector<MicroBatch> inputs = upload(batches);
    if (sharded_) backward_sharded(inputs, dloss);
    else backward_flat(inputs, dloss);
    // The tied embedding: stage 0's and the last stage's copy see the sum of both gradients
    // (under ZeRO-2/3 their parts: the two stages split the tensor alike).
    if (embed_sum_ && tile_.embed >= 0) {
      const LocalTensor& embed = tile_.tensors[size_t(tile_.embed)];
      if (sharded_) {
        const size_t u = size_t(tile_.unit_of_tensor[size_t(tile_.embed)]);
        embed_.all_reduce_sum(grads_ + mem_.plan.offset[u], mem_.plan.part[u]);  // its part
      } else {
        embed_.all_reduce_sum(grads_ + embed.offset, embed.numel);
      }
    }
    optimizer_.reduce_gradients(grads_);
    const double norm = optimizer_.grad_norm(grads_);
    const double loss = tile_.last ? mean_losses(batches.size()) : 0.0;
    // A dropped update leaves nothing behind: the gradients are zeroed at the next step's start,
    // and under ZeRO no rank has a shard to all-gather.
    // FP8: the step's amaxes, the same on every rank of the tile's data-parallel copies; into
    // the histories only when the update is applied.
    const double amax = fp8_reduce();
    const bool apply = !check || check(loss, norm, amax);
    if (apply) {
      optimizer_.step(master_, copy_, grads_, grad_clip > 0 ? clip_factor(norm, grad_clip) : 1.0,
                      lr, t);
      if (stage() == 2) sharded_->gather_full(full_params());
      move_moe_bias();
    }
    for (Fp8State* s : fp8_states()) apply ? s->commit() : s->discard();
    if (sharded_) sharded_->end_step();
    Backend::sync();  // the step's time is the device's
    return {loss, norm};
  }

  // Each micro-batch read in file order, copied in and walked alone: the losses are summed in
  // micro-batch order.
  double eval_loss_sum(const TokenSource& file, int vocab, uint64_t first,
                       uint64_t count) override {
    const size_t n = size_t(count / uint64_t(mb_));
    const size_t bytes = size_t(mb_) * T_ * sizeof(int32_t);
    Batch batch(mb_, T_ * cp_size_);
    FlatWeights<Act> flat(tile_, model_params(), nullptr);
    Weights<Act>& weights = sharded_ ? static_cast<Weights<Act>&>(*sharded_) : flat;
    double sum = 0;
    for (size_t i = 0; i < n; ++i) {
      read_eval_batch(file, first + i * uint64_t(mb_), vocab, batch);
      Backend::to_device(tokens_, own_chunks(batch.inputs.data(), 0), bytes);
      Backend::to_device(targets_, own_chunks(batch.targets.data(), 1), bytes);
      DocumentIds docs;
      if (document_eot_ >= 0)
        docs = upload_documents(batch.inputs.data(), 0,
                                [](int32_t* to, const int32_t* from, size_t size) {
                                  Backend::to_device(to, from, size);
                                });
      executor_.forward_only(weights, {MicroBatch{tokens_, targets_, losses_, docs}});
      if (tile_.last) sum += mean_losses(1);
    }
    if (sharded_) sharded_->end_step();
    // An evaluation leaves the histories alone: its amaxes are collected only to empty the
    // device slots for the next step, then dropped.
    for (auto& model : models_) model->fp8_collect();
    for (Fp8State* s : fp8_states()) s->discard();
    return sum;
  }

  std::vector<Fp8State*> fp8_states() override {
    std::vector<Fp8State*> out;
    for (auto& model : models_)
      if (Fp8State* s = model->fp8_state()) out.push_back(s);
    return out;
  }

  std::vector<double> take_moe_stats(int n_layer) override {
    std::vector<double> out(4 + 3 * size_t(n_layer), 0.0);
    out[2] = double(ep_.payload_bytes) - ep_bytes_;
    out[3] = ep_.busy_seconds - ep_seconds_;
    ep_bytes_ = double(ep_.payload_bytes);
    ep_seconds_ = ep_.busy_seconds;
    for (auto& model : models_) {
      MoeLayer<Backend>* moe = model->moe();
      if (moe == nullptr) continue;
      for (size_t i = 0; i < moe->layers().size(); ++i) {
        MoeLayerStats& s = moe->stats()[i];
        const size_t at = 4 + 3 * size_t(moe->layers()[i]);
        out[0] += s.aux_loss;
        out[1] += s.z_loss;
        out[at] += s.max_load;
        out[at + 1] += s.mean_load;
        out[at + 2] += double(s.dropped);
        s = {};
      }
    }
    return out;
  }

  std::vector<float> moe_bias() const override {
    const ModelShape& shape = tile_.canonical.shape;
    const size_t E = size_t(shape.moe.experts);
    std::vector<float> table(size_t(moe_layers(shape, 0, shape.n_layer)) * E,
                             std::numeric_limits<float>::lowest());
    for (const auto& model : models_)
      if (const MoeLayer<Backend>* moe = model->moe(); moe && !moe->bias().empty())
        for (size_t i = 0; i < moe->layers().size(); ++i)
          std::copy_n(moe->bias().begin() + long(i * E), E,
                      table.begin() + long(moe_row(moe->layers()[i]) * E));
    return table;
  }
  void set_moe_bias(const std::vector<float>& table) override {
    const size_t E = size_t(tile_.canonical.shape.moe.experts);
    for (auto& model : models_) {
      MoeLayer<Backend>* moe = model->moe();
      if (moe == nullptr || moe->bias().empty()) continue;
      std::vector<float> bias(moe->bias().size(), 0.0f);
      if (!table.empty())
        for (size_t i = 0; i < moe->layers().size(); ++i)
          std::copy_n(table.begin() + long(moe_row(moe->layers()[i]) * E), E,
                      bias.begin() + long(i * E));
      moe->set_bias(bias);
    }
  }

  size_t moe_buffer_bytes() const override {
    size_t bytes = 0;
    for (const auto& model : models_)
      if (const MoeLayer<Backend>* moe = model->moe()) bytes += moe->activation_bytes();
    return bytes;
  }

  Counters counters() const override {
    Counters c;
    c.payload[Traffic::tp] = double(tp_.payload_bytes);
    c.payload[Traffic::pp] = double(pp_.payload_bytes);
    c.payload[Traffic::embed] = double(embed_.payload_bytes);
    c.payload[Traffic::cp] = double(cp_.payload_bytes);
    c.payload[Traffic::ep] = double(ep_.payload_bytes);
    for (const auto* g : {&dp_, &own_shard_, &replica_, &own_edp_, &own_eshard_}) {
      c.payload[Traffic::dp] += double(g->payload_bytes);
      c.dp_wait += g->busy_seconds;
    }
    c.cp_wait = cp_.busy_seconds;
    for (const auto& model : models_) c.cp_attention += model->context_seconds();
    c.pipeline_wait = executor_.wait_seconds();
    c.pipeline_run = executor_.run_seconds();
    c.tp_wait = tp_.busy_seconds;
    c.ep_wait = ep_.busy_seconds;
    c.embed_wait = embed_.busy_seconds;
    c.ops = op_clock::seconds();
    return c;
  }

 private:
  int stage() const { return optimizer_.stage(); }
  const Act* model_params() const {
    if constexpr (kBf16) return copy_;
    else return master_;
  }
  // ZeRO-2's full parameters: what the model reads.
  Act* full_params() {
    if constexpr (kBf16) return copy_;
    else return master_;
  }
  // Where this rank's parts are kept in the full parameters: ZeRO-2, and ZeRO-1 with ep.
  bool parts_in_full() const { return optimizer_.by_parts() && stage() < 3; }
  // f(local, state, n) for this rank's parts of the tile (by parts: ZeRO-1 with ep, 2, 3).
  template <typename Fn>
  void each_part(Fn f) const {
    for (size_t u = 0; u < tile_.units.size(); ++u) {
      const auto [lo, hi] = mem_.plan.range(tile_, int(u));
      if (lo < hi) f(lo, mem_.plan.offset[u], hi - lo);
    }
  }
  // FP8: every chunk's pending amaxes reduced (max) over tp, cp and dp, so that every rank
  // holding the same layers keeps the same histories; returns the largest (NaN and infinity
  // become infinity: MPI's max of a NaN is unspecified), 0 without FP8.
  double fp8_reduce() {
    const std::vector<Fp8State*> states = fp8_states();
    if (states.empty()) return 0;
    for (auto& model : models_) model->fp8_collect();
    std::vector<float> all;
    for (Fp8State* s : states) all.insert(all.end(), s->pending().begin(), s->pending().end());
    for (float& x : all)
      if (std::isnan(x)) x = INFINITY;
    host_all_reduce_max(tp_.mpi(), all.data(), all.size());
    if (cp_size_ > 1) host_all_reduce_max(cp_.mpi(), all.data(), all.size());
    host_all_reduce_max(dp_.mpi(), all.data(), all.size());
    size_t at = 0;
    for (Fp8State* s : states)
      for (float& x : s->pending()) x = all[at++];
    return all.empty() ? 0.0 : double(*std::max_element(all.begin(), all.end()));
  }
  // Sequence parallelism leaves the norms' gradients partial over tp (layer l's, or with l = -1
  // the final norm's): summed over tp.
  void tp_sum(int l) {
    for (const auto& [begin, end] : models_.front()->tp_partial_gradients(l))
      tp_.all_reduce_sum(grads_ + begin, end - begin);
  }
  // The local tensor at local element x.
  int tensor_at(size_t x) const {
    for (size_t i = 0; i < tile_.tensors.size(); ++i)
      if (x >= tile_.tensors[i].offset && x < tile_.tensors[i].offset + tile_.tensors[i].numel)
        return int(i);
    return -1;
  }

  // ZeRO 0 and 1: the gradients in the full buffer. Each layer's gradient is summed over dp as
  // soon as the step's last backward finishes it (sums_whole: ZeRO-0, ZeRO-1 with ep), with its
  // sequence-parallel partial sums first; after the step's last backward the rest.
  void backward_flat(const std::vector<MicroBatch>& inputs, float dloss) {
    Backend::zero(grads_, optimizer_.buffer_size() * sizeof(float));
    auto layer_done = [&](int l) {
      tp_sum(l);
      const auto [begin, end] = tile_.layer_range(l);
      optimizer_.start_reduce(grads_, begin, end);
    };
    FlatWeights<Act> weights(tile_, model_params(), grads_);
    executor_.run(weights, inputs, dloss,
                  optimizer_.sums_whole() ? layer_done : std::function<void(int)>{});
    tp_sum(-1);
    if (!optimizer_.sums_whole())
      for (const LayerRange& chunk : tile_.chunks)
        for (int l = chunk.begin; l < chunk.end; ++l) tp_sum(l);
  }

  // model.moe.bias_rate: each chunk's MoE layers' loads of the step summed over dp x cp (every
  // micro-batch of the step's batch; tp ranks route alike, stages hold other layers), then
  // their biases moved.
  void move_moe_bias() {
    for (auto& model : models_) {
      MoeLayer<Backend>* moe = model->moe();
      if (moe == nullptr || moe->step_loads().empty()) continue;
      std::vector<double>& loads = moe->step_loads();
      if (dp_.active())
        MPI_Allreduce(MPI_IN_PLACE, loads.data(), int(loads.size()), MPI_DOUBLE, MPI_SUM,
                      dp_.mpi());
      moe->move_bias();
    }
  }
  // The row of MoE layer l in the layout-free bias table: the MoE layers before it.
  size_t moe_row(int l) const { return size_t(moe_layers(tile_.canonical.shape, 0, l)); }

  // ZeRO-2/3: the gradients reduce-scattered unit by unit as each backward produces them
  // (optim/sharded_weights.hpp; the sequence-parallel partial sums before, see allocate).
  void backward_sharded(const std::vector<MicroBatch>& inputs, float dloss) {
    sharded_->begin_step();
    executor_.run(*sharded_, inputs, dloss);
    sharded_->finish();
  }

  // The sum over the first `count` micro-batches of their mean loss: the positions' losses
  // summed in double, in order, each micro-batch's mean added in micro-batch order. The one read
  // of the losses per step.
  double mean_losses(size_t count) {
    const size_t n = size_t(mb_) * T_;
    Backend::to_host(host_losses_.data(), losses_, count * n * sizeof(float));
    double loss = 0;
    for (size_t k = 0; k < count; ++k) {
      double sum = 0;
      for (size_t i = 0; i < n; ++i) sum += host_losses_[k * n + i];
      loss += sum / double(n);
    }
    return loss;
  }

  // Context parallelism: this rank's chunks r and 2 cp - 1 - r of each of the micro-batch's
  // sequences (mb_, T_ * cp_size_) of `full`, copied into staging area `k` (it stays untouched
  // until the step's uploads are complete); `full` itself without it.
  const int32_t* own_chunks(const int32_t* full, size_t k) {
    return own_chunks_into(full, cp_size_ == 1 ? nullptr : staging_.data() + k * size_t(mb_) * T_);
  }
  const int32_t* own_chunks_into(const int32_t* full, int32_t* out) {
    if (cp_size_ == 1) return full;
    context_chunks(full, mb_, T_ * cp_size_, cp_size_, cp_rank_, out);
    return out;
  }

  // data.document_mask: micro-batch k's document ids (engine/sequences.hpp's, of its whole
  // sequences `inputs`, then this rank's chunks of them: starts in true positions, as the
  // attention compares them) from host area k (untouched until the step's uploads are complete)
  // into device memory by `copy` (Backend::to_device, or the overlapped Backend::upload).
  template <class Copy>
  DocumentIds upload_documents(const int32_t* inputs, size_t k, Copy copy) {
    const size_t own = size_t(mb_) * T_, n = own * cp_size_;
    int32_t* start = doc_full_.data() + 2 * k * n;
    document_ids(inputs, mb_, T_ * cp_size_, document_eot_, start, start + n);
    int32_t* mine = cp_size_ == 1 ? nullptr : doc_own_.data() + 2 * k * own;
    int32_t* dev = doc_start_ + 2 * k * own;
    const size_t bytes = own * sizeof(int32_t);
    copy(dev, own_chunks_into(start, mine), bytes);
    copy(dev + own, own_chunks_into(start + n, mine ? mine + own : nullptr), bytes);
    return {dev, dev + own};
  }

  // The step's micro-batches from the loader's ring into the token buffers, overlapped with the
  // compute queued before; stages that read no tokens get nullptr.
  std::vector<MicroBatch> upload(const std::vector<HostMicroBatch>& batches) {
    std::vector<MicroBatch> out(batches.size());
    const size_t n = size_t(mb_) * T_;
    for (size_t k = 0; k < batches.size(); ++k) out[k].losses = losses_ + k * n;
    if (batches.empty() || batches[0].tokens == nullptr) return out;
    for (size_t k = 0; k < batches.size(); ++k) {
      const int32_t* tokens = own_chunks(batches[k].tokens, 2 * k);
      const int32_t* targets = own_chunks(batches[k].targets, 2 * k + 1);
      Backend::upload(tokens_ + k * n, tokens, n * sizeof(int32_t));
      Backend::upload(targets_ + k * n, targets, n * sizeof(int32_t));
      out[k].tokens = tokens_ + k * n;
      out[k].targets = targets_ + k * n;
      if (document_eot_ >= 0)
        out[k].docs = upload_documents(batches[k].tokens, k,
                                       [](int32_t* to, const int32_t* from, size_t size) {
                                         Backend::upload(to, from, size);
                                       });
    }
    Backend::await_uploads();
    return out;
  }

  // The mesh's group of `dims` (none without a mesh), and whether ZeRO's groups are smaller than
  // dp x cp (hybrid sharding: a shard communicator of their own).
  static MPI_Comm group(const EngineSetup& s, const DimNames& dims) {
    return s.mesh ? s.mesh->group(dims) : MPI_COMM_NULL;
  }
  static bool experts_split(const EngineSetup& s) { return s.mesh && s.mesh->shape().has("ep"); }
  static bool hybrid(const EngineSetup& s) {
    return s.mesh && s.mesh->size("shard") < s.mesh->shape().group_size({"dp", "cp"});
  }

  const LocalLayout& tile_;
  int mb_, T_;  // T_: this rank's tokens of each sequence (T / cp)
  int cp_size_, cp_rank_;
  std::vector<int32_t> staging_;  // cp > 1: this rank's chunks of the step's tokens and targets
  // data.document_mask: the end-of-text id; the step's document starts and positions (whole
  // sequences, and under cp this rank's chunks of them) and their device copy, micro-batch k's
  // starts and positions in areas 2k and 2k + 1.
  int64_t document_eot_ = -1;
  std::vector<int32_t> doc_full_, doc_own_;
  int32_t* doc_start_ = nullptr;
  size_t step_tokens_ = 0;
  bool embed_sum_, prefetch_;
  // The arena before the communicators, so that on an error the communicators go first (their
  // destructors abort NCCL's kernels), then the memory they used.
  Arena arena_;
  typename Backend::Comm tp_, dp_, pp_, embed_;
  // Hybrid sharding's ZeRO group (without it dp_ is the group) and replicas (one rank without).
  typename Backend::Comm own_shard_, replica_;
  typename Backend::Comm cp_;  // context parallelism (one rank without it)
  Comm world_;                 // every rank, over MPI: the gradient norm's one double
  // Expert parallelism: ep, edp (dp_ without ep) and edp in this ZeRO group (edp_ if not hybrid).
  typename Backend::Comm ep_, own_edp_, own_eshard_;
  double ep_bytes_ = 0, ep_seconds_ = 0;  // ep_'s counters at the last take_moe_stats
  typename Backend::Comm *shard_, *edp_, *eshard_;
  EngineMemory<Backend> mem_;  // every buffer's declaration (engine/engine_memory.hpp)
  std::vector<std::unique_ptr<Gpt<Backend>>>& models_;
  DistributedOptimizer<Backend>& optimizer_;
  PipelineExecutor<Backend>& executor_;
  std::unique_ptr<ShardedWeights<Backend>> sharded_own_;  // ZeRO-2/3, once allocated
  ShardedWeights<Backend>* sharded_ = nullptr;
  float* master_ = nullptr;
  float* grads_ = nullptr;
  Act* copy_ = nullptr;  // bf16 only: what the model reads
  int32_t* tokens_ = nullptr;
  int32_t* targets_ = nullptr;
  float* losses_ = nullptr;          // (micro-batches, B*T) on the last stage
  std::vector<float> host_losses_;   // the same, read once per step
  std::vector<float> host_params_;  // the host state where it is not the master itself
};

}  // namespace

EngineKind engine_kind(const Config& cfg, bool gpu) {
  if (!gpu) return EngineKind::cpu;
  const Precision p = cfg.device.precision;
  return p == Precision::Bf16 || p == Precision::Fp8 ? EngineKind::cuda_bf16
                                                     : EngineKind::cuda_fp32;
}

std::unique_ptr<TrainEngine> make_engine(const EngineSetup& setup, EngineKind kind,
                                         Allocation allocation) {
  const bool now = allocation == Allocation::now;
#ifdef TESSERA_CUDA
  if (kind == EngineKind::cuda_bf16)
    return std::make_unique<Engine<CudaBackend<cuda::bf16>>>(setup, now);
  if (kind == EngineKind::cuda_fp32) return std::make_unique<Engine<CudaBackend<float>>>(setup, now);
#else
  if (kind != EngineKind::cpu) throw UserError("this tessera was built without the CUDA backend");
#endif
  return std::make_unique<Engine<CpuBackend>>(setup, now);
}

}  // namespace tessera
