// seedrl's reference actor in C++: K CartPole-v1 envs streamed to a seedrl learner.
//
//   seedrl-actor --learner HOST:PORT [--envs-per-actor K] [--auth-token T] [--max-backoff-s S]
//                [--seed N] [--actor-id NAME] [--max-frames N] [--tls-ca PEM [--tls-server-name H]]
//                [--no-local-socket]
//
// It follows docs/wire-protocol.md and nothing else: GetInfo, then one Act stream (Hello,
// then a Frame of K envs per step answered by K actions) until the learner says Shutdown;
// reconnect with capped, jittered exponential backoff on UNAVAILABLE and the other
// transport statuses; exit 2 on INVALID_ARGUMENT, UNAUTHENTICATED or an env it cannot run;
// exit 0 on Shutdown{final: true}, SIGINT or SIGTERM. The walk-through is in
// docs/actors-in-other-languages.md; `python -m seedrl.conformance actor -- CMD` tests it.

#include <grpcpp/grpcpp.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <iostream>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cartpole.h"
#include "seedrl/proto/seedrl.grpc.pb.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "tensors travel little-endian");

namespace seedrl {
namespace {

namespace pb = ::seedrl::v1;

constexpr uint32_t kProtocolVersion = 1;
constexpr char kEnvId[] = "CartPole-v1";
constexpr int kMaxMessageBytes = 64 * 1024 * 1024;
constexpr int kExitMisconfigured = 2;

// ------------------------------------------------------------------------ flags

struct Flags {
  std::string learner;
  int envs_per_actor = 1;
  std::string auth_token;  // default: $SEEDRL_AUTH_TOKEN
  double max_backoff_s = 30.0;
  uint64_t seed = std::random_device{}();
  std::string actor_id;
  int64_t max_frames = 0;  // 0: until the learner finishes
  std::string tls_ca;
  std::string tls_ca_pem;  // the file's certificates, read once at start-up
  std::string tls_server_name;
  bool local_socket = true;  // take the unix socket a learner on this host offers
};

[[noreturn]] void Usage(const std::string& problem) {
  std::cerr << "seedrl-actor: " << problem << "\n";
  std::exit(kExitMisconfigured);
}

Flags ParseFlags(int argc, char** argv) {
  Flags flags;
  if (const char* token = std::getenv("SEEDRL_AUTH_TOKEN")) flags.auth_token = token;
  for (int i = 1; i < argc; ++i) {
    std::string name = argv[i];
    if (name == "--no-local-socket") {  // the one flag without a value
      flags.local_socket = false;
      continue;
    }
    std::string value;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      Usage(name + " needs a value");
    }
    try {
      if (name == "--learner") flags.learner = value;
      else if (name == "--envs-per-actor") flags.envs_per_actor = std::stoi(value);
      else if (name == "--auth-token") flags.auth_token = value;
      else if (name == "--max-backoff-s") flags.max_backoff_s = std::stod(value);
      else if (name == "--seed") flags.seed = std::stoull(value);
      else if (name == "--actor-id") flags.actor_id = value;
      else if (name == "--max-frames") flags.max_frames = std::stoll(value);
      else if (name == "--tls-ca") flags.tls_ca = value;
      else if (name == "--tls-server-name") flags.tls_server_name = value;
      else Usage("unknown flag " + name);
    } catch (const std::exception&) {
      Usage(name + ": not a number: " + value);
    }
  }
  if (flags.learner.empty()) Usage("--learner HOST:PORT is required");
  if (flags.envs_per_actor < 1 || flags.envs_per_actor > 4096) {
    Usage("--envs-per-actor must be in [1, 4096]");
  }
  if (!(flags.max_backoff_s > 0)) Usage("--max-backoff-s must be > 0");
  if (!flags.tls_ca.empty()) {
    // An unreadable or empty CA file must not mean "trust the system's public CAs", which
    // is what gRPC does with empty root certificates.
    std::ifstream file(flags.tls_ca);
    std::stringstream pem;
    if (file) pem << file.rdbuf();
    flags.tls_ca_pem = pem.str();
    if (flags.tls_ca_pem.find("-----BEGIN CERTIFICATE-----") == std::string::npos) {
      Usage("--tls-ca " + flags.tls_ca + ": no PEM certificate could be read from it");
    }
  }
  if (flags.actor_id.empty()) {
    char host[256] = "host";
    gethostname(host, sizeof host - 1);
    flags.actor_id = std::string(host) + "-" + std::to_string(getpid()) + "-cpp";
  }
  return flags;
}

// ------------------------------------------------------------------------ addresses

bool StartsWith(const std::string& text, const std::string& prefix) {
  return text.compare(0, prefix.size(), prefix) == 0;
}

// Whether HOST:PORT names this host through the loopback interface (IPv6 in brackets).
bool IsLoopback(const std::string& target) {
  if (StartsWith(target, "unix:")) return false;
  std::string host = target;
  if (StartsWith(target, "[")) {
    host = target.substr(0, target.find(']') + 1);
  } else if (auto colon = target.rfind(':'); colon != std::string::npos) {
    host = target.substr(0, colon);
  }
  return host == "localhost" || host == "[::1]" || host == "::1" || StartsWith(host, "127.");
}

// The unix socket a learner offers in GetInfo if this actor can use it, else "": only
// after a loopback or unix dial (the learner is on this host) and where the socket file
// is seen (the same filesystem: not across containers). Serving frontends each offer
// their own, so same-host actors spread over them whichever took their TCP connection.
std::string LocalTarget(const std::string& offered, const std::string& dialled) {
  const bool same_host = IsLoopback(dialled) || StartsWith(dialled, "unix:");
  if (!StartsWith(offered, "unix:") || !same_host || offered == dialled) return "";
  struct stat file;
  return stat(offered.substr(5).c_str(), &file) == 0 ? offered : "";
}

// ------------------------------------------------------------------------ envs

// K CartPoles in gymnasium's NEXT_STEP autoreset mode, written straight into a Frame:
// an env whose episode ended sends its final observation with the flag set, and on the
// next step resets (ignoring its action) and sends the reset observation, reward 0.
class Envs {
 public:
  Envs(int k, uint64_t seed) : envs_(k), ended_(k, false), rng_(seed) {}

  // Fresh episodes (a new connection starts new ones): the first frame of a stream.
  void Reset(pb::Frame* frame) {
    Prepare(frame);
    for (size_t i = 0; i < envs_.size(); ++i) {
      envs_[i].Reset(rng_);
      ended_[i] = false;
      Write(frame, i, 0.0f, false, false);
    }
  }

  void Step(const std::vector<int64_t>& actions, pb::Frame* frame) {
    for (size_t i = 0; i < envs_.size(); ++i) {
      if (ended_[i]) {
        envs_[i].Reset(rng_);
        ended_[i] = false;
        Write(frame, i, 0.0f, false, false);
        continue;
      }
      const CartPole::Outcome out = envs_[i].Step(static_cast<int>(actions[i]));
      ended_[i] = out.terminated || out.truncated;
      Write(frame, i, out.reward, out.terminated, out.truncated);
    }
  }

  int size() const { return static_cast<int>(envs_.size()); }

 private:
  // Tensors are {dtype, shape, raw little-endian bytes}; the bytes are rewritten in place.
  void Prepare(pb::Frame* frame) {
    const int k = size();
    SetTensor(frame->mutable_observations(), "float32", {k, CartPole::kObsDim}, 4);
    SetTensor(frame->mutable_rewards(), "float32", {k}, 4);
    SetTensor(frame->mutable_terminated(), "bool", {k}, 1);
    SetTensor(frame->mutable_truncated(), "bool", {k}, 1);
  }

  static void SetTensor(pb::Tensor* t, const char* dtype, std::vector<int64_t> shape, size_t item) {
    t->set_dtype(dtype);
    t->clear_shape();
    size_t n = item;
    for (int64_t d : shape) {
      t->add_shape(d);
      n *= static_cast<size_t>(d);
    }
    t->mutable_data()->resize(n);
  }

  void Write(pb::Frame* frame, size_t i, float reward, bool terminated, bool truncated) {
    float obs[CartPole::kObsDim];
    envs_[i].Observe(obs);
    std::memcpy(&(*frame->mutable_observations()->mutable_data())[i * sizeof obs], obs, sizeof obs);
    std::memcpy(&(*frame->mutable_rewards()->mutable_data())[i * 4], &reward, 4);
    (*frame->mutable_terminated()->mutable_data())[i] = terminated ? 1 : 0;
    (*frame->mutable_truncated()->mutable_data())[i] = truncated ? 1 : 0;
  }

  std::vector<CartPole> envs_;
  std::vector<bool> ended_;
  std::mt19937_64 rng_;
};

// What the actor sends as its env in the Hello: CartPole-v1's spaces as gymnasium has them.
pb::EnvSpec CartPoleSpec(const std::string& kwargs_json) {
  pb::EnvSpec spec;
  spec.set_env_id(kEnvId);
  spec.set_env_kwargs_json(kwargs_json);
  pb::SpaceSpec* obs = spec.mutable_observation_space();
  obs->set_kind("box");
  obs->set_dtype("float32");
  obs->add_shape(CartPole::kObsDim);
  const float inf = std::numeric_limits<float>::infinity();
  const float high[4] = {static_cast<float>(CartPole::kXThreshold * 2), inf,
                         static_cast<float>(CartPole::kThetaThreshold * 2), inf};
  const float low[4] = {-high[0], -inf, -high[2], -inf};
  for (auto [tensor, values] : {std::pair{obs->mutable_low(), low}, {obs->mutable_high(), high}}) {
    tensor->set_dtype("float32");
    tensor->add_shape(CartPole::kObsDim);
    tensor->set_data(values, sizeof low);
  }
  pb::SpaceSpec* act = spec.mutable_action_space();
  act->set_kind("discrete");
  act->set_dtype("int64");
  act->set_n(CartPole::kNumActions);
  return spec;
}

// "" when the learner trains what this actor can run; else why not, in one line.
std::string Unsupported(const pb::LearnerInfo& info) {
  if (info.protocol_version() != kProtocolVersion) {
    return "the learner speaks protocol version " + std::to_string(info.protocol_version()) +
           "; this actor speaks " + std::to_string(kProtocolVersion);
  }
  const pb::EnvSpec& env = info.env();
  std::string kwargs = env.env_kwargs_json();
  kwargs.erase(std::remove(kwargs.begin(), kwargs.end(), ' '), kwargs.end());
  if (env.env_id() != kEnvId || !(kwargs.empty() || kwargs == "{}")) {
    return "unsupported env " + env.env_id() + " " + env.env_kwargs_json() +
           ": this actor runs CartPole-v1 without kwargs";
  }
  const pb::SpaceSpec& obs = env.observation_space();
  const pb::SpaceSpec& act = env.action_space();
  if (obs.kind() != "box" || obs.dtype() != "float32" || obs.shape_size() != 1 ||
      obs.shape(0) != CartPole::kObsDim || act.kind() != "discrete" ||
      act.n() != CartPole::kNumActions) {
    return "the learner's CartPole-v1 spaces differ from gymnasium's";
  }
  return "";
}

// ------------------------------------------------------------------------ backoff

// Capped exponential backoff with jitter: the n-th wait in a row is uniform in
// [c/2, c], c = min(cap, 0.1 s * 2^n); a connection the learner accepts starts it over.
class Backoff {
 public:
  explicit Backoff(double cap) : cap_(cap), rng_(std::random_device{}()) {}
  double Next() {
    const double ceiling = std::min(cap_, 0.1 * std::pow(2.0, std::min(attempt_++, 30)));
    return std::uniform_real_distribution<double>(ceiling / 2, ceiling)(rng_);
  }
  void Reset() { attempt_ = 0; }
  int attempt() const { return attempt_; }

 private:
  double cap_;
  int attempt_ = 0;
  std::mt19937_64 rng_;
};

bool Retryable(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
    case grpc::StatusCode::CANCELLED:
    case grpc::StatusCode::ABORTED:
    case grpc::StatusCode::INTERNAL:
    case grpc::StatusCode::UNKNOWN:
      return true;
    default:
      return false;  // INVALID_ARGUMENT, UNAUTHENTICATED, ...: a bug or a misconfiguration
  }
}

const char* CodeName(grpc::StatusCode code) {
  static const char* names[] = {
      "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
      "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
      "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
      "UNAUTHENTICATED"};
  const int i = static_cast<int>(code);
  return i >= 0 && i < 17 ? names[i] : "?";
}

// ------------------------------------------------------------------------ the actor

enum class End { kFinished, kRestart, kClosed, kFailed, kMaxFrames, kStopped };

class Actor {
 public:
  explicit Actor(Flags flags)
      : flags_(std::move(flags)),
        target_(flags_.learner),
        envs_(flags_.envs_per_actor, flags_.seed),
        backoff_(flags_.max_backoff_s),
        ids_(std::random_device{}()) {}

  // Connect, stream, reconnect until the learner finishes or a signal; the exit status.
  int Run() {
    while (!stopping_) {
      auto stub = pb::Learner::NewStub(Channel());
      pb::LearnerInfo info;
      grpc::Status status = GetInfo(*stub, &info);
      End end = End::kFailed;
      const bool on_local = target_ != flags_.learner;
      const int64_t streamed = streams_;
      if (status.ok()) {
        if (std::string why = Unsupported(info); !why.empty()) {
          Log(why);
          return kExitMisconfigured;
        }
        if (!on_local && flags_.local_socket && !local_failed_) {
          if (std::string local = LocalTarget(info.local_address(), target_); !local.empty()) {
            Log("learner on this host, using " + local);
            target_ = local;
            continue;
          }
        }
        end = Stream(*stub, info, &status);
      }
      if (on_local && streams_ == streamed && end == End::kFailed &&
          status.error_code() == grpc::StatusCode::UNAVAILABLE) {
        // The socket exists but does not take us (another user's learner, a stale file):
        // TCP worked a moment ago, so use it from now on.
        Log("cannot use the learner's local socket " + target_ + " (" + status.error_message() +
            "); staying on TCP");
        local_failed_ = true;
        target_ = flags_.learner;
        continue;
      }
      target_ = flags_.learner;  // a reconnect asks --learner which socket to take again
      if (stopping_ || end == End::kStopped || end == End::kMaxFrames) return 0;
      if (end == End::kFinished) {
        Log("the learner finished training after " + std::to_string(frames_) + " frames");
        return 0;
      }
      if (end == End::kFailed && !Retryable(status.error_code())) {
        Log(std::string("the learner refused: ") + CodeName(status.error_code()) + ": " +
            status.error_message());
        return kExitMisconfigured;
      }
      const double delay = backoff_.Next();
      std::ostringstream line;
      if (end == End::kRestart) line << "the learner is restarting";
      else if (end == End::kClosed) line << "the learner closed the stream";
      else line << "learner unavailable (" << CodeName(status.error_code()) << ": "
                << status.error_message() << ")";
      line << "; retrying in " << delay << " s";
      Log(line.str());
      Sleep(delay);
    }
    return 0;
  }

  // From the signal thread: end Run soon, cancelling the open stream.
  void Stop() {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    if (context_ != nullptr) context_->TryCancel();
    wake_.notify_all();
  }

 private:
  std::shared_ptr<grpc::Channel> Channel() const {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(kMaxMessageBytes);
    args.SetMaxSendMessageSize(kMaxMessageBytes);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);  // notice a vanished learner
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 5000);
    args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
    args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
    std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
    if (!flags_.tls_ca.empty()) {
      grpc::SslCredentialsOptions tls;
      tls.pem_root_certs = flags_.tls_ca_pem;
      credentials = grpc::SslCredentials(tls);
      if (!flags_.tls_server_name.empty()) {
        args.SetSslTargetNameOverride(flags_.tls_server_name);
      }
    }
    return grpc::CreateCustomChannel(target_, credentials, args);
  }

  void Authorize(grpc::ClientContext* context) const {
    if (!flags_.auth_token.empty()) {
      context->AddMetadata("authorization", "Bearer " + flags_.auth_token);
    }
  }

  grpc::Status GetInfo(pb::Learner::Stub& stub, pb::LearnerInfo* info) {
    grpc::ClientContext context;
    Authorize(&context);
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return stub.GetInfo(&context, pb::GetInfoRequest(), info);
  }

  // One Act stream: Hello -> Accept, then the lockstep frame/actions loop.
  End Stream(pb::Learner::Stub& stub, const pb::LearnerInfo& info, grpc::Status* status) {
    grpc::ClientContext context;
    Authorize(&context);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return End::kStopped;
      context_ = &context;
    }
    End end = StreamOn(context, stub, info, status);
    std::lock_guard<std::mutex> lock(mu_);
    context_ = nullptr;
    return stopping_ ? End::kStopped : end;
  }

  End StreamOn(grpc::ClientContext& context, pb::Learner::Stub& stub, const pb::LearnerInfo& info,
               grpc::Status* status) {
    auto stream = stub.Act(&context);
    pb::ActorMessage message;
    pb::Hello* hello = message.mutable_hello();
    hello->set_protocol_version(kProtocolVersion);
    hello->set_actor_id(flags_.actor_id);
    hello->set_run_id(FreshRunId());  // the learner gives this connection fresh slots
    hello->set_num_envs(envs_.size());
    *hello->mutable_env() = CartPoleSpec(info.env().env_kwargs_json());
    pb::LearnerMessage reply;
    if (!stream->Write(message) || !stream->Read(&reply) || !reply.has_accept()) {
      return Finish(*stream, status);
    }
    backoff_.Reset();
    ++streams_;
    Log("connected to " + target_ + " with " + std::to_string(envs_.size()) + " envs");

    pb::Frame* frame = message.mutable_frame();  // the Hello is done: the message is a Frame now
    envs_.Reset(frame);
    std::vector<int64_t> actions(envs_.size());
    while (stream->Write(message) && stream->Read(&reply)) {
      if (reply.has_shutdown()) {  // end our side, then the learner ends the stream
        stream->WritesDone();
        context.TryCancel();
        stream->Finish();
        return reply.shutdown().final() ? End::kFinished : End::kRestart;
      }
      if (std::string bad = ReadActions(reply, &actions); !bad.empty()) {
        context.TryCancel();
        stream->Finish();
        *status = grpc::Status(grpc::StatusCode::INTERNAL, bad);
        return End::kFailed;
      }
      envs_.Step(actions, frame);
      frames_ += envs_.size();
      if (flags_.max_frames > 0 && frames_ >= flags_.max_frames) {
        stream->WritesDone();
        context.TryCancel();
        stream->Finish();
        return End::kMaxFrames;
      }
    }
    return Finish(*stream, status);
  }

  // The learner ended the stream: with OK a reconnect, else its status is the error.
  End Finish(grpc::ClientReaderWriter<pb::ActorMessage, pb::LearnerMessage>& stream,
             grpc::Status* status) {
    *status = stream.Finish();
    return status->ok() ? End::kClosed : End::kFailed;
  }

  // The K actions of a reply, checked against the wire layout ("" when they are fine).
  std::string ReadActions(const pb::LearnerMessage& reply, std::vector<int64_t>* actions) const {
    if (!reply.has_actions()) return "the learner's reply carries no actions";
    const pb::Tensor& t = reply.actions().actions();
    const size_t k = actions->size();
    if (t.dtype() != "int64" || t.shape_size() != 1 || t.shape(0) != static_cast<int64_t>(k) ||
        t.data().size() != k * sizeof(int64_t)) {
      return "the learner's actions are not int64 [K]";
    }
    std::memcpy(actions->data(), t.data().data(), t.data().size());
    for (int64_t a : *actions) {
      if (a < 0 || a >= CartPole::kNumActions) return "an action is outside Discrete(2)";
    }
    return "";
  }

  std::string FreshRunId() {
    std::ostringstream id;
    id << std::hex << ids_() << ids_();
    return id.str();
  }

  void Sleep(double seconds) {
    std::unique_lock<std::mutex> lock(mu_);
    wake_.wait_for(lock, std::chrono::duration<double>(seconds), [this] { return stopping_.load(); });
  }

  void Log(const std::string& line) const {
    std::cerr << "seedrl-actor " << flags_.actor_id << ": " << line << std::endl;
  }

  Flags flags_;
  std::string target_;  // where the next connection goes: --learner, or its offered socket
  bool local_failed_ = false;  // the offered socket would not take us: TCP from now on
  int64_t streams_ = 0;  // streams the learner accepted
  Envs envs_;
  Backoff backoff_;
  std::mt19937_64 ids_;
  int64_t frames_ = 0;
  std::mutex mu_;
  std::condition_variable wake_;
  std::atomic<bool> stopping_{false};
  grpc::ClientContext* context_ = nullptr;  // the open stream's, for Stop to cancel
};

}  // namespace
}  // namespace seedrl

int main(int argc, char** argv) {
  seedrl::Flags flags = seedrl::ParseFlags(argc, argv);
  // SIGINT/SIGTERM go to one thread that stops the actor; gRPC's threads never see them.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  seedrl::Actor actor(std::move(flags));
  std::thread([&actor, signals] {
    int received = 0;
    sigwait(&signals, &received);
    actor.Stop();
  }).detach();
  return actor.Run();
}
