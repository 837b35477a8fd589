// mpi_train: data-parallel training of the MLP example under MPI, with the optimizer state sharded
// across ranks ZeRO-style and offloaded by strata.
//
// Every rank holds the whole bf16 model and the data set; rank r owns the contiguous shard
// [n*r/R, n*(r+1)/R) of the flat parameters and its offloaded AdamW state, on two paths of its
// own: DIR/rank-r under the first --path (node-local, e.g. NVMe) and under the second (shared,
// e.g. a PFS). One step:
//   1. each rank runs forward and backward on its micro-chunks of the global batch;
//   2. gradients are reduce-scattered deterministically: every owner receives each micro-chunk's
//      gradient of its shard (MPI_Alltoallv) and sums them in micro-chunk order, so the sums, and
//      the final weights, are bit-identical for any rank count that divides --chunks;
//   3. each rank steps its shard with offloaded_adamw, which writes the shard's bf16 weights;
//   4. the weights are all-gathered (MPI_Allgatherv) into every rank's model.
// The shared path of every rank is behind node_limiters named after the node (one for reads and one
// for writes, or one for both with --io-sharing shared), so at most --io-limit ranks of a node read,
// and as many write, on it at once; ranks find their node's peers with
// MPI_Comm_split_type(MPI_COMM_TYPE_SHARED). --io-log records every permit taken and given back.
//
// To see what that gate buys on one machine, --shared-cap and --local-cap emulate the node's links:
// every rank's path goes through a throttled link named after the node, so all ranks of the node
// share its bandwidth; --switch-cost is the time the shared link loses whenever it passes from one
// request to another, with requests crossing it in --link-chunk pieces (bench/scripts/mpi_scaling.sh).
//
// Checkpoints (--checkpoint DIR, every --checkpoint-every steps): every rank saves its shard to
// DIR/step-S/rank-r; after a barrier (all shards durable) rank 0 writes the model and the job's
// manifest, then points DIR/LATEST at step-S. --resume continues from LATEST with the same number
// of ranks, bit-identically. The manifest records every training setting; a resume with other
// values is refused, naming each, unless --allow-change lists it (and settings the checkpoint
// itself fixes, like the weight decay kept in the optimizer's checkpoint, cannot change).
//
//   mpirun -np 4 mpi_train --path /nvme/job --path /pfs/job --io-limit 1 --checkpoint /pfs/job/ckpt
#include <mpi.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <strata/strata.hpp>

#include "mlp_common.hpp"
#include "mlp_cpu.hpp"

namespace {

namespace fs = std::filesystem;
using mlp_example::config;
using mlp_example::dataset;
using mlp_example::mlp_shape;
using mlp_example::rng;
using mlp_example::workspace;

/// The options of mpi_train on top of the model's.
struct mpi_config : config {
  std::size_t io_limit = 1;           // ranks of a node on the shared path at once (0: no limiter)
  std::size_t chunks = 4;             // micro-chunks per batch (the rank count must divide it)
  strata::rw_sharing io_sharing = strata::rw_sharing::separate;  // one gate per direction, or one for both
  double shared_cap = 0;              // bytes/s of the node's emulated shared link (0: not emulated)
  double local_cap = 0;               // bytes/s of the node's emulated local link (0: not emulated)
  std::uint64_t link_chunk = 1 << 20;  // pieces requests cross an emulated link in
  std::chrono::microseconds switch_cost{0};  // the shared link's loss per change of request
  fs::path checkpoint;                // job checkpoints (empty: none)
  std::size_t checkpoint_every = 0;   // steps between checkpoints (0: only at the end)
  bool resume = false;
  std::vector<std::string> allow_change;  // settings a --resume may change (--allow-change)
  std::optional<std::size_t> die_at;  // a test's crash: --die-at STEP kills --die-rank at that step
  int die_rank = 0;
  fs::path io_log;                    // per-rank permit log (FILE.rank-r)
};

std::string usage() {
  return fmt::format(
      "usage: mpirun -np R mpi_train [options]\n"
      "Data-parallel training of the MLP example: the optimizer state sharded over the ranks and offloaded\n"
      "by strata to a node-local and a shared path per rank; gradients reduce-scattered deterministically,\n"
      "weights all-gathered. The final weights are bit-identical for every rank count dividing --chunks.\n"
      "{}.\n"
      "{}"
      "  --path DIR        give two: the node-local directory, then the shared one (each rank uses DIR/rank-r)\n"
      "  --threads N       threads per rank for forward, backward and the update; default: all CPUs / ranks on the node\n"
      "  --io-limit N      ranks of a node reading (and writing) on the shared path at once (node_limiters); 0: no\n"
      "                    limit; default 1\n"
      "  --io-sharing S    separate (default): one limit for reads, one for writes; shared: one limit for both\n"
      "  --shared-cap BW   emulate the node's shared link: BW bytes/s each way (e.g. 500MB) for all its ranks together\n"
      "  --local-cap BW    emulate the node's local link (NVMe) the same way\n"
      "  --switch-cost US  microseconds the emulated shared link loses whenever it passes to another request\n"
      "  --link-chunk B    requests cross an emulated link in pieces of B bytes, interleaving; default 1MiB\n"
      "  --chunks M        micro-chunks per batch, reduced in a fixed order; the rank count must divide it; default 4\n"
      "  --checkpoint DIR  save a job checkpoint there (on shared storage) every --checkpoint-every steps and at the end\n"
      "  --checkpoint-every N  steps between checkpoints; default: only at the end\n"
      "  --resume          continue from DIR/LATEST (the same number of ranks and settings as it was saved with)\n"
      "  --allow-change L  with --resume: the settings that may differ from the checkpoint's, a comma-separated\n"
      "                    list of lr, batch, epochs, samples (a new --samples draws a new data set); the\n"
      "                    model's shape, --weight-decay and --subgroup cannot change\n"
      "  --io-log FILE     write every permit of the shared path's limiter to FILE.rank-R (monotonic ns, +1/-1)\n"
      "  --die-at STEP     (tests) kill --die-rank R (default 0) with SIGKILL in the middle of step STEP\n"
      "{}",
      mlp_example::help_exit_codes, mlp_example::help_model_options, mlp_example::help_run_options);
}

// --- MPI -----------------------------------------------------------------------------------------

/// An MPI call that failed: strata::error naming the call and MPI's reason.
void mpi_check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw strata::error(fmt::format("{} failed: {}", what, std::string(text, static_cast<std::size_t>(len))));
}

int to_int(std::size_t v, const char* what) {
  if (v > static_cast<std::size_t>(INT_MAX)) throw strata::config_error(fmt::format("{}: {} exceeds MPI's int counts", what, v));
  return static_cast<int>(v);
}

/// MPI_Init/Finalize for main's scope; MPI errors return codes (checked) instead of aborting.
struct mpi_session {
  mpi_session(int& argc, char**& argv) {
    int provided = 0;
    if (MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
      std::fprintf(stderr, "mpi_train: MPI_Init_thread failed\n");
      std::exit(1);
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  }
  ~mpi_session() { MPI_Finalize(); }
  mpi_session(const mpi_session&) = delete;
  mpi_session& operator=(const mpi_session&) = delete;
};

/// Where this rank stands: in the job and on its node.
struct placement {
  int rank = 0, ranks = 1;            // MPI_COMM_WORLD
  int node_rank = 0, node_ranks = 1;  // the ranks sharing this node's memory (MPI_COMM_TYPE_SHARED)
  std::string node;                   // MPI_Get_processor_name
};

placement find_placement() {
  placement p;
  mpi_check(MPI_Comm_rank(MPI_COMM_WORLD, &p.rank), "MPI_Comm_rank");
  mpi_check(MPI_Comm_size(MPI_COMM_WORLD, &p.ranks), "MPI_Comm_size");
  MPI_Comm node = MPI_COMM_NULL;
  mpi_check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, p.rank, MPI_INFO_NULL, &node),
            "MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)");
  mpi_check(MPI_Comm_rank(node, &p.node_rank), "MPI_Comm_rank(node)");
  mpi_check(MPI_Comm_size(node, &p.node_ranks), "MPI_Comm_size(node)");
  MPI_Comm_free(&node);
  char name[MPI_MAX_PROCESSOR_NAME];
  int len = 0;
  mpi_check(MPI_Get_processor_name(name, &len), "MPI_Get_processor_name");
  p.node.assign(name, static_cast<std::size_t>(len));
  return p;
}

/// A node-wide object's name (limiter, link) from the node's name: letters, digits, '.', '_' and '-'.
std::string node_object_name(const std::string& what, const std::string& node) {
  std::string s = "mpi-train-" + what + "-";
  for (char ch : node) s += (std::isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == '_' || ch == '-') ? ch : '_';
  return s.substr(0, 120);
}

// --- the shared path's limiter, logged ---------------------------------------------------------------

/// Every permit of the shared path's gates taken (+1, after it is held) and given back (-1, before
/// it is released), with CLOCK_MONOTONIC (one clock for every process of a node) and the gate
/// ('r', 'w', or 'b' for both), so merging every rank's log shows how many held one at once.
class permit_log {
 public:
  void note(int d, char gate) noexcept {
    timespec ts{};
    ::clock_gettime(CLOCK_MONOTONIC, &ts);
    const std::int64_t ns = static_cast<std::int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
    try {
      std::lock_guard lock(mutex_);
      events_.push_back({ns, d, gate});
    } catch (...) {  // out of memory: the log loses an event, the run goes on
    }
  }
  /// Writes the log ("<ns> <+1|-1> <gate>" per line); io_error naming the file on failure.
  void write(const fs::path& file) const {
    std::ofstream out(file);
    std::lock_guard lock(mutex_);
    for (const auto& e : events_) out << e.ns << ' ' << e.d << ' ' << e.gate << '\n';
    out.close();
    if (!out) throw strata::io_error("write --io-log", file.string(), EIO);
  }

 private:
  struct event {
    std::int64_t ns;
    int d;
    char gate;
  };
  mutable std::mutex mutex_;
  std::vector<event> events_;
};

/// A strata::limiter that forwards to a node_limiter and notes each permit in a permit_log.
class logged_limiter {
 public:
  logged_limiter(strata::node_limiter& inner, permit_log& log, char gate) : inner_(inner), log_(log), gate_(gate) {}
  void acquire() {
    inner_.acquire();
    log_.note(+1, gate_);
  }
  bool try_acquire() {
    if (!inner_.try_acquire()) return false;
    log_.note(+1, gate_);
    return true;
  }
  template <class Rep, class Period>
  bool try_acquire_for(std::chrono::duration<Rep, Period> t) {
    if (!inner_.try_acquire_for(t)) return false;
    log_.note(+1, gate_);
    return true;
  }
  strata::completion acquire_async() {
    auto c = inner_.acquire_async();
    c.on_complete([this](std::exception_ptr e) {  // registered first: runs before the request is issued
      if (!e) log_.note(+1, gate_);
    });
    return c;
  }
  void release() noexcept {
    log_.note(-1, gate_);
    inner_.release();
  }

 private:
  strata::node_limiter& inner_;
  permit_log& log_;
  char gate_;
};
static_assert(strata::limiter<logged_limiter>);

// --- one rank's optimizer ------------------------------------------------------------------------------

using tier_type = strata::dynamic_multipath<strata::bandwidth_proportional>;
using optimizer_type = strata::offloaded_adamw<tier_type, strata::sweep_aware, strata::alternating>;
using preset = strata::presets::strata_preset;

/// The rank's two paths: node-local, and shared behind the node's gates; each over the node's
/// emulated link when its cap is given.
struct rank_paths {
  std::optional<strata::rw_limiter<strata::node_limiter>> gates;
  permit_log log;
  std::optional<strata::rw_limiter<logged_limiter>> logged;
  std::unique_ptr<tier_type> tier;
  std::vector<fs::path> dirs;
};

std::unique_ptr<rank_paths> make_paths(const mpi_config& c, const placement& p) {
  auto rp = std::make_unique<rank_paths>();
  const std::string sub = fmt::format("rank-{}", p.rank);
  rp->dirs = {c.paths[0] / sub, c.paths[1] / sub};
  const auto node_ranks = static_cast<double>(p.node_ranks);
  // One path's file tier, declaring this rank's share of the node's link (placement splits by it),
  // and the emulated link's options (a bandwidth of 0: not emulated).
  const auto path = [&](std::size_t k, const char* name, double cap, double otherwise) {
    strata::file_tier_options f = mlp_example::state_path(rp->dirs[k]);
    f.name = name;
    f.read_bandwidth = f.write_bandwidth = cap > 0 ? cap / node_ranks : otherwise;
    strata::throttle_options link{.read_bandwidth = cap, .write_bandwidth = cap};
    if (cap > 0) {
      link.link = node_object_name(fmt::format("{}-link", name), p.node);
      link.chunk_bytes = c.link_chunk;
      if (k == 1) link.switch_cost = c.switch_cost;
    }
    return std::pair{f, link};
  };
  const strata::checksum_options sums{.block_bytes = 64 * 1024};
  std::vector<strata::any_tier> paths;
  const auto [local, local_link] = path(0, "local", c.local_cap, 2e9);
  paths.push_back(strata::any_tier::make<strata::checksummed<strata::throttled<strata::file_tier>>>(sums, local_link, local));
  const auto [shared, shared_link] = path(1, "shared", c.shared_cap, 1e9);
  if (c.io_limit > 0) {
    rp->gates = strata::make_node_rw_limiter(node_object_name("shared", p.node), c.io_limit, c.io_sharing);
    const auto logged = [&](strata::node_limiter& l, char gate) {
      return std::make_shared<logged_limiter>(l, rp->log, gate);
    };
    if (c.io_sharing == strata::rw_sharing::shared)
      rp->logged.emplace(logged(rp->gates->reads(), 'b'));
    else
      rp->logged.emplace(logged(rp->gates->reads(), 'r'), logged(rp->gates->writes(), 'w'));
    paths.push_back(
        strata::any_tier::make<strata::checksummed<strata::limited<strata::throttled<strata::file_tier>, logged_limiter>>>(
            sums, *rp->logged, shared_link, shared));
  } else {
    paths.push_back(strata::any_tier::make<strata::checksummed<strata::throttled<strata::file_tier>>>(sums, shared_link, shared));
  }
  rp->tier = std::make_unique<tier_type>(strata::bandwidth_proportional{}, std::move(paths), "paths");
  return rp;
}

// --- checkpoints of the job ----------------------------------------------------------------------

/// Writes `text` to `file` durably and atomically (temporary file, fsync, rename, fsync of the
/// directory), so a crash leaves the old content or the new one.
void publish(const fs::path& file, std::span<const std::byte> bytes) {
  const fs::path tmp = file.string() + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw strata::io_error("open", tmp.string(), errno);
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int e = errno;
      ::close(fd);
      throw strata::io_error("write", tmp.string(), e);
    }
    done += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0) {
    const int e = errno;
    ::close(fd);
    throw strata::io_error("fsync", tmp.string(), e);
  }
  if (::close(fd) != 0) throw strata::io_error("close", tmp.string(), errno);
  if (::rename(tmp.c_str(), file.c_str()) != 0) throw strata::io_error("rename", file.string(), errno);
  const int dfd = ::open(file.parent_path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) throw strata::io_error("open", file.parent_path().string(), errno);
  const int rc = ::fsync(dfd);
  const int e = errno;
  ::close(dfd);
  if (rc != 0) throw strata::io_error("fsync", file.parent_path().string(), e);
}

void publish_text(const fs::path& file, const std::string& text) {
  publish(file, std::as_bytes(std::span<const char>(text.data(), text.size())));
}

std::string read_text(const fs::path& file) {
  std::ifstream in(file);
  if (!in) throw strata::io_error("open", file.string(), errno ? errno : ENOENT);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

/// A training setting a job checkpoint records: its option's name and its value as text (doubles
/// in their shortest round-trip form, so equal text is an equal value).
struct setting {
  std::string name, value;
};

/// Settings a resume may change when --allow-change names them.
constexpr std::array<std::string_view, 4> changeable_settings{"lr", "batch", "epochs", "samples"};

/// Why a setting the checkpoint fixes cannot change on a resume; empty for a changeable one.
std::string_view fixed_because(std::string_view name) {
  if (name == "weight-decay") return "it is saved in the optimizer's checkpoint, which the resume restores";
  if (name == "subgroup") return "the optimizer's state is saved in subgroups of this size";
  if (name == "layers" || name == "hidden" || name == "inputs" || name == "outputs")
    return "the checkpoint's weights have the model's shape";
  return {};
}

/// Every training setting of `c`, as the job checkpoint records it.
std::vector<setting> training_settings(const mpi_config& c) {
  return {{"layers", std::to_string(c.layers)},
          {"hidden", std::to_string(c.hidden)},
          {"inputs", std::to_string(c.inputs)},
          {"outputs", std::to_string(c.outputs)},
          {"samples", std::to_string(c.samples)},
          {"batch", std::to_string(c.batch)},
          {"epochs", std::to_string(c.epochs)},
          {"lr", fmt::format("{}", c.lr)},
          {"weight-decay", fmt::format("{}", c.weight_decay)},
          {"subgroup", c.subgroup ? std::to_string(c.subgroup) : std::string("default")}};
}

/// The job manifest: "key value" lines. Version 2 adds the training settings (version 1 ones,
/// without them, are still read: their settings cannot be checked).
struct job_manifest {
  std::uint64_t step = 0, ranks = 0, params = 0, chunks = 0, seed = 0, model_checksum = 0;
  std::vector<setting> settings;  // empty for a version 1 manifest

  [[nodiscard]] std::string text() const {
    std::string t =
        fmt::format("strata-mpi-train 2\nstep {}\nranks {}\nparams {}\nchunks {}\nseed {}\nmodel_checksum {:016x}\n",
                    step, ranks, params, chunks, seed, model_checksum);
    for (const auto& st : settings) t += fmt::format("{} {}\n", st.name, st.value);
    return t;
  }
  static job_manifest parse(const fs::path& file) {
    std::istringstream in(read_text(file));
    std::string key, magic;
    job_manifest m;
    int version = 0;
    in >> magic >> version;
    if (magic != "strata-mpi-train" || (version != 1 && version != 2))
      throw strata::integrity_error("job manifest", file.string(), 0, "not a strata-mpi-train 1 or 2 manifest");
    const auto names = training_settings(mpi_config{});
    int seen = 0;
    while (in >> key) {
      if (key == "model_checksum") {
        in >> std::hex >> m.model_checksum >> std::dec;
        ++seen;
        continue;
      }
      if (std::any_of(names.begin(), names.end(), [&](const setting& st) { return st.name == key; })) {
        std::string v;
        in >> v;
        m.settings.push_back({key, v});
        continue;
      }
      std::uint64_t v = 0;
      in >> v;
      if (key == "step") m.step = v, ++seen;
      else if (key == "ranks") m.ranks = v, ++seen;
      else if (key == "params") m.params = v, ++seen;
      else if (key == "chunks") m.chunks = v, ++seen;
      else if (key == "seed") m.seed = v, ++seen;
    }
    if (seen != 6 || (version == 2 && m.settings.size() != names.size()))
      throw strata::integrity_error("job manifest", file.string(), 0, "a field is missing");
    return m;
  }
};

/// Where a --resume starts: the checkpoint's directory and manifest.
struct resume_point {
  fs::path dir;
  job_manifest manifest;
  std::vector<std::string> changes;  // "--lr from 0.01 to 0.02", one per changed setting
};

/// Reads DIR/LATEST's manifest and checks that this job can continue it: the same ranks,
/// parameters, --chunks and --seed, and the same training settings, except those in
/// --allow-change. A difference is a config_error with one line per setting, both values named.
resume_point check_resume(const mpi_config& c, const placement& p) {
  resume_point r;
  const std::string latest = read_text(c.checkpoint / "LATEST");
  r.dir = c.checkpoint / latest.substr(0, latest.find('\n'));
  r.manifest = job_manifest::parse(r.dir / "job.manifest");
  const auto& m = r.manifest;
  const std::size_t n = mlp_shape(c).params;
  if (m.ranks != static_cast<std::uint64_t>(p.ranks) || m.params != n || m.chunks != c.chunks || m.seed != c.seed)
    throw strata::config_error(fmt::format(
        "--resume: {} was saved by {} ranks with {} parameters, --chunks {}, --seed {}; this job has {} ranks, {}, "
        "{}, {}",
        r.dir.string(), m.ranks, m.params, m.chunks, m.seed, p.ranks, n, c.chunks, c.seed));
  if (m.settings.empty()) {
    if (p.rank == 0)
      std::fprintf(stderr, "mpi_train: warning: %s was saved by an older mpi_train that did not record its settings: "
                           "they are not checked\n", r.dir.c_str());
    return r;
  }
  std::string refused;
  std::vector<std::string> to_allow;
  bool fixed = false;
  for (const auto& now : training_settings(c)) {
    const auto saved =
        std::find_if(m.settings.begin(), m.settings.end(), [&](const setting& st) { return st.name == now.name; });
    if (saved == m.settings.end() || saved->value == now.value) continue;
    const auto why = fixed_because(now.name);
    const bool allowed = std::find(c.allow_change.begin(), c.allow_change.end(), now.name) != c.allow_change.end();
    if (why.empty() && allowed) {
      r.changes.push_back(fmt::format("--{} from {} to {}", now.name, saved->value, now.value));
      continue;
    }
    refused += fmt::format("\n  --{}: {} in the checkpoint, {} now", now.name, saved->value, now.value);
    if (!why.empty()) {
      refused += fmt::format(" (cannot change: {})", why);
      fixed = true;
    } else {
      to_allow.push_back(now.name);
    }
  }
  if (!refused.empty()) {
    std::string advice = to_allow.empty() ? std::string("give the checkpoint's values")
                         : fixed ? fmt::format("give the checkpoint's values (--allow-change {} would accept the "
                                               "changeable ones)", fmt::join(to_allow, ","))
                                 : fmt::format("give the checkpoint's values, or --allow-change {} to train on with "
                                               "the new ones", fmt::join(to_allow, ","));
    throw strata::config_error(
        fmt::format("--resume: {} was saved with other settings:{}\n{}", r.dir.string(), refused, advice));
  }
  const std::size_t steps = c.samples / c.batch * c.epochs;
  if (steps < m.step)
    throw strata::config_error(fmt::format("--resume: {} is at step {}, past the {} steps of this job "
                                           "(--epochs {} of {} steps)",
                                           r.dir.string(), m.step, steps, c.epochs, c.samples / c.batch));
  return r;
}

/// Creates the checkpoint directory and a file in it (removed again), so that a path that cannot
/// hold checkpoints fails now rather than when the first one is saved, after training.
void check_checkpoint_dir(const fs::path& dir, const placement& p) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw strata::io_error("--checkpoint: mkdir", dir, ec.value());
  if (!fs::is_directory(dir, ec)) throw strata::io_error("--checkpoint: mkdir", dir, ENOTDIR);
  const fs::path probe = dir / fmt::format(".mpi_train-probe.rank-{}", p.rank);
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw strata::io_error("--checkpoint: create a file", probe, errno);
  const bool wrote = ::write(fd, "x", 1) == 1;
  const int e = errno;
  ::close(fd);
  ::unlink(probe.c_str());
  if (!wrote) throw strata::io_error("--checkpoint: write", probe, e);
}

/// Saves the job at `step`: every rank its shard, then (after all are durable) rank 0 the model,
/// the manifest and LATEST.
void save_job(const mpi_config& c, const placement& p, optimizer_type& opt, std::span<const strata::bf16> model,
              std::size_t step) {
  const fs::path dir = c.checkpoint / fmt::format("step-{}", step);
  if (p.rank == 0) fs::create_directories(dir);
  mpi_check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier(checkpoint directory)");
  opt.save(dir / fmt::format("rank-{}", p.rank));
  mpi_check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier(shards durable)");  // every shard's manifest is published
  if (p.rank == 0) {
    publish(dir / "model.bin", std::as_bytes(model));
    const job_manifest m{.step = step,
                         .ranks = static_cast<std::uint64_t>(p.ranks),
                         .params = model.size(),
                         .chunks = c.chunks,
                         .seed = c.seed,
                         .model_checksum = strata::checksum64(std::as_bytes(model)),
                         .settings = training_settings(c)};
    publish_text(dir / "job.manifest", m.text());
    publish_text(c.checkpoint / "LATEST", fmt::format("step-{}\n", step));
  }
  mpi_check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier(checkpoint published)");
}

// --- training --------------------------------------------------------------------------------------

/// The shard of rank r of R over n parameters.
std::pair<std::size_t, std::size_t> shard(std::size_t n, int r, int ranks) {
  const auto R = static_cast<std::size_t>(ranks), k = static_cast<std::size_t>(r);
  return {n * k / R, n * (k + 1) / R};
}

int run(const mpi_config& c, const placement& p, const std::optional<resume_point>& resumed) {
  const mlp_shape net(c);
  const std::size_t n = net.params;
  if (c.chunks % static_cast<std::size_t>(p.ranks) != 0)
    throw strata::config_error(fmt::format("--chunks {} is not a multiple of the {} ranks", c.chunks, p.ranks));
  if (c.batch % c.chunks != 0)
    throw strata::config_error(fmt::format("--batch {} is not a multiple of --chunks {}", c.batch, c.chunks));
  if (static_cast<std::size_t>(p.ranks) > n)
    throw strata::config_error(fmt::format("{} ranks for {} parameters", p.ranks, n));
  const auto [lo, hi] = shard(n, p.rank, p.ranks);
  const std::size_t mine = hi - lo;
  const std::size_t per_rank = c.chunks / static_cast<std::size_t>(p.ranks), chunk_size = c.batch / c.chunks;

  std::unique_ptr<strata::thread_pool> pool;
  if (c.threads > 1) pool = std::make_unique<strata::thread_pool>(c.threads, "mpi_train");
  rng r(c.seed);
  const dataset data = mlp_example::make_data(net, c.samples, r, pool.get());
  const std::vector<float> init = mlp_example::init_weights(net, r);
  std::vector<strata::bf16> model = mlp_example::to_bf16(init);
  const strata::adamw_options adamw{.lr = c.lr, .weight_decay = c.weight_decay};

  const auto rp = make_paths(c, p);
  const auto options = preset::options(mine, adamw, mlp_example::offload_base(c, mine));
  std::size_t start = 0;  // steps already done
  std::optional<optimizer_type> opt;
  if (resumed) {
    const fs::path& dir = resumed->dir;
    const auto& m = resumed->manifest;
    std::ifstream in(dir / "model.bin", std::ios::binary);
    in.read(reinterpret_cast<char*>(model.data()), static_cast<std::streamsize>(n * sizeof(strata::bf16)));
    if (!in || strata::checksum64(std::as_bytes(std::span<const strata::bf16>(model))) != m.model_checksum)
      throw strata::integrity_error("model", (dir / "model.bin").string(), 0, "short or damaged");
    opt.emplace(optimizer_type::load(dir / fmt::format("rank-{}", p.rank), *rp->tier, options));
    start = m.step;
  } else {
    opt.emplace(*rp->tier, std::span<const float>(init).subspan(lo, mine), adamw, options);
  }
  if (p.rank == 0) {
    std::printf("mpi_train: MLP %s (%zu parameters, bf16), %d ranks on %s (%d of them on this node), shards of about "
                "%zu, %zu micro-chunks of %zu samples per batch of %zu, %zu threads per rank\n",
                net.describe().c_str(), n, p.ranks, p.node.c_str(), p.node_ranks, mine, c.chunks, chunk_size, c.batch,
                c.threads);
    const std::string gate =
        c.io_limit == 0 ? std::string("none")
                        : fmt::format("'{}' ({} of the node's ranks at once, {})", node_object_name("shared", p.node),
                                      c.io_limit,
                                      c.io_sharing == strata::rw_sharing::separate ? "reads and writes each" : "reads and writes together");
    const auto link = [](double cap) {
      return cap > 0 ? fmt::format(" over an emulated node link of {}/s", strata::format_size(static_cast<std::uint64_t>(cap)))
                     : std::string();
    };
    std::printf("rank 0: %zu subgroups, paths %s%s and %s%s, shared path limiter %s\n", opt->subgroup_count(),
                rp->dirs[0].c_str(), link(c.local_cap).c_str(), rp->dirs[1].c_str(), link(c.shared_cap).c_str(),
                gate.c_str());
    if (c.shared_cap > 0 && c.switch_cost.count() > 0)
      std::printf("shared link: %lld us lost per change of request, %s pieces\n",
                  static_cast<long long>(c.switch_cost.count()), strata::format_size(c.link_chunk).c_str());
    if (resumed)
      std::printf("resumed from step %zu%s\n", start,
                  resumed->changes.empty() ? ""
                                           : fmt::format(", changing {}", fmt::join(resumed->changes, ", ")).c_str());
    std::fflush(stdout);
  }

  // Per step buffers: this rank's micro-chunk gradients (whole model each), what goes to every
  // owner, what comes back (every chunk's gradient of my shard), the sum.
  workspace ws(net, chunk_size);
  std::vector<float> partial(per_rank * n), send(per_rank * n), recv(c.chunks * mine), sum(mine);
  std::vector<strata::bf16> grads(mine);
  std::vector<int> send_counts(static_cast<std::size_t>(p.ranks)), send_displs(send_counts.size()),
      recv_counts(send_counts.size()), recv_displs(send_counts.size()), model_counts(send_counts.size()),
      model_displs(send_counts.size());
  {
    std::size_t s_at = 0, r_at = 0;
    for (int q = 0; q < p.ranks; ++q) {
      const auto [qlo, qhi] = shard(n, q, p.ranks);
      const auto k = static_cast<std::size_t>(q);
      send_counts[k] = to_int(per_rank * (qhi - qlo), "send count");
      send_displs[k] = to_int(s_at, "send displacement");
      s_at += per_rank * (qhi - qlo);
      recv_counts[k] = to_int(per_rank * mine, "receive count");
      recv_displs[k] = to_int(r_at, "receive displacement");
      r_at += per_rank * mine;
      model_counts[k] = to_int((qhi - qlo) * sizeof(strata::bf16), "model count");
      model_displs[k] = to_int(qlo * sizeof(strata::bf16), "model displacement");
    }
  }

  const std::size_t in_w = net.widths.front(), out_w = net.widths.back();
  const std::size_t per_epoch = c.samples / c.batch, steps = per_epoch * c.epochs;
  std::vector<std::uint32_t> order(c.samples);
  rng shuffle(c.seed ^ 0x5eedda7aULL);  // the order train_mlp uses
  std::vector<double> losses;
  workspace eval_ws(net, c.batch);
  const auto evaluate = [&](std::size_t epoch) {
    if (p.rank != 0) return;
    const double loss = mlp_example::evaluate(net, data, model, c.batch, eval_ws, pool.get());
    std::printf("epoch %zu: loss %.4f\n", epoch, loss);
    std::fflush(stdout);
    losses.push_back(loss);
  };
  if (start == 0) evaluate(0);
  double step_s = 0;
  std::size_t timed = 0, done = 0;
  for (std::size_t e = 0; e < c.epochs; ++e) {
    for (std::size_t k = 0; k < c.samples; ++k) order[k] = static_cast<std::uint32_t>(k);
    for (std::size_t k = c.samples - 1; k > 0; --k) std::swap(order[k], order[shuffle.next() % (k + 1)]);
    for (std::size_t s = 0; s < per_epoch; ++s, ++done) {
      if (done < start) continue;  // before the checkpoint we resumed from
      const auto t0 = std::chrono::steady_clock::now();
      mlp_example::load_model(net, model, ws);
      // 1. Forward and backward on my micro-chunks; the loss is the global batch's MSE.
      for (std::size_t j = 0; j < per_rank; ++j) {
        const std::size_t chunk = static_cast<std::size_t>(p.rank) * per_rank + j;
        for (std::size_t b = 0; b < chunk_size; ++b) {
          const std::size_t k = order[s * c.batch + chunk * chunk_size + b];
          std::copy_n(data.inputs.data() + k * in_w, in_w, ws.act[0].data() + b * in_w);
          std::copy_n(data.targets.data() + k * out_w, out_w, ws.target.data() + b * out_w);
        }
        mlp_example::forward(net, chunk_size, ws, pool.get(), c.batch);
        mlp_example::backward(net, chunk_size, ws, pool.get());
        std::copy(ws.grad.begin(), ws.grad.end(), partial.begin() + static_cast<std::ptrdiff_t>(j * n));
      }
      // 2. Deterministic reduce-scatter: owner q gets every chunk's gradient of its shard.
      {
        std::size_t at = 0;
        for (int q = 0; q < p.ranks; ++q) {
          const auto [qlo, qhi] = shard(n, q, p.ranks);
          for (std::size_t j = 0; j < per_rank; ++j) {
            std::copy(partial.begin() + static_cast<std::ptrdiff_t>(j * n + qlo),
                      partial.begin() + static_cast<std::ptrdiff_t>(j * n + qhi), send.begin() + static_cast<std::ptrdiff_t>(at));
            at += qhi - qlo;
          }
        }
      }
      mpi_check(MPI_Alltoallv(send.data(), send_counts.data(), send_displs.data(), MPI_FLOAT, recv.data(),
                              recv_counts.data(), recv_displs.data(), MPI_FLOAT, MPI_COMM_WORLD),
                "MPI_Alltoallv(gradients)");
      // recv holds chunk 0, 1, ..., M-1 of my shard, in order (rank q sent chunks q*per_rank...).
      std::copy_n(recv.begin(), mine, sum.begin());
      for (std::size_t chunk = 1; chunk < c.chunks; ++chunk)
        for (std::size_t i = 0; i < mine; ++i) sum[i] += recv[chunk * mine + i];
      for (std::size_t i = 0; i < mine; ++i) grads[i] = strata::bf16(sum[i]);
      if (c.die_at && *c.die_at == done && c.die_rank == p.rank) {
        std::fprintf(stderr, "mpi_train: rank %d: killing itself in step %zu (--die-at)\n", p.rank, done);
        std::fflush(stderr);
        ::raise(SIGKILL);
      }
      // 3. My shard's step; the optimizer writes its bf16 weights into my part of the model.
      opt->step(std::span<const strata::bf16>(grads), mlp_example::schedule(c.lr, done, steps),
                std::span<strata::bf16>(model).subspan(lo, mine));
      // 4. Every rank gets every shard's weights.
      mpi_check(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, model.data(), model_counts.data(),
                               model_displs.data(), MPI_BYTE, MPI_COMM_WORLD),
                "MPI_Allgatherv(weights)");
      if (done > start || steps - start == 1) {  // the first step of a run warms caches: not timed, unless alone
        step_s += mlp_example::seconds_since(t0);
        ++timed;
      }
      if (!c.checkpoint.empty() && c.checkpoint_every > 0 && (done + 1) % c.checkpoint_every == 0 && done + 1 < steps)
        save_job(c, p, *opt, model, done + 1);
    }
    if (done > start) evaluate(e + 1);
  }
  if (!c.checkpoint.empty()) save_job(c, p, *opt, model, steps);
  // The last step returns with its state writes in flight (return_before_writes), each holding a
  // permit: they land before the log is written.
  opt->flush();
  if (rp->logged && !c.io_log.empty()) rp->log.write(fs::path(c.io_log.string() + fmt::format(".rank-{}", p.rank)));

  // Per-rank step time and traffic, gathered on rank 0.
  const double mean = timed ? step_s / static_cast<double>(timed) : 0.0;
  std::vector<double> means(static_cast<std::size_t>(p.ranks));
  mpi_check(MPI_Gather(&mean, 1, MPI_DOUBLE, means.data(), 1, MPI_DOUBLE, 0, MPI_COMM_WORLD), "MPI_Gather(step times)");
  int verdict = 0;
  if (p.rank == 0) {
    const auto [mn, mx] = std::minmax_element(means.begin(), means.end());
    std::printf("step time per rank: mean %.4f s (min %.4f, max %.4f) over %zu steps%s\n",
                std::accumulate(means.begin(), means.end(), 0.0) / static_cast<double>(means.size()), *mn, *mx, timed,
                steps - start > 1 ? " after the first" : "");
    const auto st = opt->stats();
    std::printf("rank 0 optimizer: %llu steps, cache hits %llu / misses %llu, read %s, written %s\n",
                static_cast<unsigned long long>(st.steps), static_cast<unsigned long long>(st.cache_hits),
                static_cast<unsigned long long>(st.cache_misses), strata::format_size(st.bytes_read).c_str(),
                strata::format_size(st.bytes_written).c_str());
    std::printf("final weights' checksum %016llx\n",
                static_cast<unsigned long long>(strata::checksum64(std::as_bytes(std::span<const strata::bf16>(model)))));
    std::fflush(stdout);
    if (!c.resume && losses.size() >= 2 && !mlp_example::loss_fell("mpi_train", losses)) verdict = 1;
  }
  if (!c.keep) {
    (void)opt->remove_state();
    opt.reset();
    rp->tier.reset();
    mlp_example::remove_empty_directories(rp->dirs);
  }
  return verdict;
}

}  // namespace

int main(int argc, char** argv) {
  mpi_session mpi(argc, argv);
  placement p;
  try {
    p = find_placement();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mpi_train: %s\n", e.what());
    return 1;
  }
  std::optional<resume_point> resumed;
  const int rc = mlp_example::example_main<mpi_config>(
      "mpi_train", usage(), argc, argv,
      [&](mpi_config& c) {
        mlp_example::parse_args(c, argc, argv, {}, [&](std::string_view opt, auto& value) {
          if (opt == "--io-limit") c.io_limit = mlp_example::parse_number(opt, value(), 0, 4096);
          else if (opt == "--chunks") c.chunks = mlp_example::parse_number(opt, value(), 1, 1 << 16);
          else if (opt == "--shared-cap")
            c.shared_cap = static_cast<double>(mlp_example::parse_for(opt, value(), strata::parse_size));
          else if (opt == "--local-cap")
            c.local_cap = static_cast<double>(mlp_example::parse_for(opt, value(), strata::parse_size));
          else if (opt == "--link-chunk")
            c.link_chunk = mlp_example::parse_for(opt, value(), strata::parse_size);
          else if (opt == "--switch-cost")
            c.switch_cost = std::chrono::microseconds(mlp_example::parse_number(opt, value(), 0, 10'000'000));
          else if (opt == "--io-sharing") {
            const std::string v = value();
            if (v == "separate") c.io_sharing = strata::rw_sharing::separate;
            else if (v == "shared") c.io_sharing = strata::rw_sharing::shared;
            else mlp_example::bad_usage("--io-sharing takes separate or shared");
          }
          else if (opt == "--checkpoint") c.checkpoint = mlp_example::file_system_path(opt, value());
          else if (opt == "--checkpoint-every") c.checkpoint_every = mlp_example::parse_number(opt, value(), 1, 1 << 30);
          else if (opt == "--resume") c.resume = true;
          else if (opt == "--allow-change") {
            std::string list = value();
            for (std::size_t at = 0; at <= list.size();) {
              const std::size_t end = std::min(list.find(',', at), list.size());
              const std::string name = list.substr(at, end - at);
              at = end + 1;
              if (const auto why = fixed_because(name); !why.empty())
                mlp_example::bad_usage(fmt::format("--allow-change: {} cannot change on a resume: {}", name, why));
              if (std::find(changeable_settings.begin(), changeable_settings.end(), name) == changeable_settings.end())
                mlp_example::bad_usage(fmt::format("--allow-change: unknown setting '{}'; expected a comma-separated "
                                                   "list of {}", name, fmt::join(changeable_settings, ", ")));
              c.allow_change.push_back(name);
            }
          }
          else if (opt == "--io-log") c.io_log = mlp_example::file_system_path(opt, value());
          else if (opt == "--die-at") c.die_at = mlp_example::parse_number(opt, value(), 0, 1 << 30);
          else if (opt == "--die-rank") c.die_rank = static_cast<int>(mlp_example::parse_number(opt, value(), 0, 1 << 20));
          else return false;
          return true;
        });
        if (c.paths.size() != 2) mlp_example::bad_usage("give --path twice: the node-local directory, then the shared one");
        if (c.resume && c.checkpoint.empty()) mlp_example::bad_usage("--resume needs --checkpoint DIR");
        if (!c.allow_change.empty() && !c.resume) mlp_example::bad_usage("--allow-change needs --resume");
        if (!c.io_log.empty() && c.io_limit == 0) mlp_example::bad_usage("--io-log needs a limiter (--io-limit 1 or more)");
        bool threads_given = false;
        for (int i = 1; i < argc; ++i) threads_given = threads_given || std::string_view(argv[i]) == "--threads";
        if (!threads_given && p.node_ranks > 1)  // the node's CPUs are shared by its ranks
          c.threads = std::max<std::size_t>(1, c.threads / static_cast<std::size_t>(p.node_ranks));
        // Before any data is made or state written: a checkpoint path that cannot be used, or a
        // resume with other settings, fails in the first second, not after training.
        if (!c.checkpoint.empty()) check_checkpoint_dir(c.checkpoint, p);
        if (c.resume) resumed = check_resume(c, p);
      },
      [&](const mpi_config& c) { return run(c, p, resumed); });
  if (rc != 0 && p.ranks > 1) MPI_Abort(MPI_COMM_WORLD, rc);  // the other ranks may wait in a collective
  return rc;
}
