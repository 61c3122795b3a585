#include "backends/TcpGroup.h"
#include "support/Error.h"

#include <algorithm>
#include <arpa/inet.h>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <thread>
#include <unistd.h>
#include <vector>

namespace tgc {

float reduceInRankOrder(const float *const *inputs, size_t ranks, size_t i, ReduceOp op) {
  double acc = inputs[0][i];
  for (size_t r = 1; r < ranks; ++r)
    acc = op == ReduceOp::Max ? std::max(acc, double(inputs[r][i])) : acc + double(inputs[r][i]);
  if (op == ReduceOp::Avg)
    acc /= double(ranks);
  return float(acc);
}

namespace {

using Clock = std::chrono::steady_clock;
constexpr uint32_t kHello = 0x74676348, kCall = 0x74676343; // "tgcH", "tgcC"

/// A connection with the peer's name for errors ("rank 2", "rank 0 at HOST:PORT").
struct Peer {
  int fd = -1;
  std::string name;
};

void closeAll(std::vector<Peer> &peers) {
  for (Peer &p : peers)
    if (p.fd >= 0)
      ::close(p.fd), p.fd = -1;
}

/// Waits until `fd` is ready for `events` or the deadline passes.
llvm::Error waitFor(const Peer &peer, short events, Clock::time_point deadline, const char *what) {
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0)
      return makeError("{} {} nothing within the timeout", peer.name, what);
    pollfd p{peer.fd, events, 0};
    int n = ::poll(&p, 1, int(std::min<long long>(left, 1000)));
    if (n > 0)
      return llvm::Error::success();
    if (n < 0 && errno != EINTR)
      return makeError("{}: poll failed: {}", peer.name, std::strerror(errno));
  }
}

llvm::Error sendAll(const Peer &peer, const void *data, size_t bytes, Clock::time_point deadline) {
  const char *p = static_cast<const char *>(data);
  while (bytes) {
    if (auto err = waitFor(peer, POLLOUT, deadline, "took"))
      return err;
    ssize_t n = ::send(peer.fd, p, bytes, MSG_NOSIGNAL);
    if (n < 0 && (errno == EINTR || errno == EAGAIN))
      continue;
    if (n <= 0)
      return makeError("{} closed its connection (it ended, or its host did): {}", peer.name, std::strerror(errno));
    p += n, bytes -= size_t(n);
  }
  return llvm::Error::success();
}

llvm::Error recvAll(const Peer &peer, void *data, size_t bytes, Clock::time_point deadline) {
  char *p = static_cast<char *>(data);
  while (bytes) {
    if (auto err = waitFor(peer, POLLIN, deadline, "sent"))
      return err;
    ssize_t n = ::recv(peer.fd, p, bytes, 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN))
      continue;
    if (n <= 0)
      return makeError("{} closed its connection (it ended, or its host did)", peer.name);
    p += n, bytes -= size_t(n);
  }
  return llvm::Error::success();
}

/// A status and a message: what rank 0 answers a hello or a collective with.
llvm::Error sendStatus(const Peer &peer, const std::string &failure, Clock::time_point deadline) {
  uint32_t size = uint32_t(failure.size());
  if (auto err = sendAll(peer, &size, sizeof size, deadline))
    return err;
  return sendAll(peer, failure.data(), failure.size(), deadline);
}
llvm::Error recvStatus(const Peer &peer, Clock::time_point deadline) {
  uint32_t size = 0;
  if (auto err = recvAll(peer, &size, sizeof size, deadline))
    return err;
  if (size == 0)
    return llvm::Error::success();
  std::string failure(std::min<uint32_t>(size, 4096), '\0');
  if (auto err = recvAll(peer, failure.data(), failure.size(), deadline))
    return err;
  return makeError("{}", failure);
}

struct CallHeader {
  uint32_t magic = kCall, kind = 0, op = 0, pad = 0;
  uint64_t count = 0;
  bool operator==(const CallHeader &o) const { return magic == o.magic && kind == o.kind && op == o.op && count == o.count; }
};
enum Kind : uint32_t { AllReduce, ReduceScatter, AllGather };

class TcpRank : public Communicator {
public:
  TcpRank(int rank, int ranks, double timeout, std::vector<Peer> peers)
      : rank_(rank), ranks_(ranks), timeout_(timeout), peers_(std::move(peers)) {}
  ~TcpRank() override { closeAll(peers_); }
  int rank() const override { return rank_; }
  int ranks() const override { return ranks_; }
  llvm::Error allReduceHost(float *data, size_t count, ReduceOp op) override {
    return collective({kCall, AllReduce, uint32_t(op), 0, count}, data, data);
  }
  llvm::Error reduceScatterHost(const float *in, float *out, size_t count, ReduceOp op) override {
    return collective({kCall, ReduceScatter, uint32_t(op), 0, count}, in, out);
  }
  llvm::Error allGatherHost(const float *in, float *out, size_t count) override {
    return collective({kCall, AllGather, 0, 0, count}, in, out);
  }

private:
  Clock::time_point deadline() const {
    return Clock::now() + std::chrono::milliseconds(int64_t(timeout_ * 1000));
  }
  /// Each rank's input floats and its result's: a part of `count` for the sharded ends.
  static size_t inputCount(const CallHeader &h, int ranks) { return h.kind == AllGather ? h.count / ranks : h.count; }
  static size_t outputCount(const CallHeader &h, int ranks) {
    return h.kind == ReduceScatter ? h.count / ranks : h.count;
  }
  llvm::Error collective(CallHeader h, const float *in, float *out) {
    if (h.kind != AllReduce && h.count % size_t(ranks_))
      return makeError("rank {}: {} floats do not split into {} equal parts", rank_, h.count, ranks_);
    if (ranks_ == 1) {
      std::copy(in, in + inputCount(h, 1), out);
      return llvm::Error::success();
    }
    auto err = rank_ == 0 ? lead(h, in, out) : follow(h, in, out);
    if (err)
      closeAll(peers_); // the others then stop too, at their next read
    return err;
  }
  llvm::Error follow(const CallHeader &h, const float *in, float *out);
  llvm::Error lead(const CallHeader &h, const float *in, float *out);

  int rank_, ranks_;
  double timeout_;
  std::vector<Peer> peers_; // rank 0: ranks 1..N-1 in order; the others: rank 0
};

llvm::Error TcpRank::follow(const CallHeader &h, const float *in, float *out) {
  const Peer &root = peers_.at(0);
  if (root.fd < 0)
    return makeError("rank {}: the group stopped after an earlier error", rank_);
  auto until = deadline();
  if (auto err = sendAll(root, &h, sizeof h, until))
    return err;
  if (auto err = sendAll(root, in, inputCount(h, ranks_) * 4, until))
    return err;
  until = deadline();
  if (auto err = recvStatus(root, until))
    return makeError("rank {}: {}", rank_, llvm::toString(std::move(err)));
  return recvAll(root, out, outputCount(h, ranks_) * 4, until);
}

llvm::Error TcpRank::lead(const CallHeader &h, const float *in, float *out) {
  std::vector<std::vector<float>> inputs(ranks_);
  std::vector<const float *> pointers(ranks_, in);
  std::string failure;
  for (int r = 1; r < ranks_; ++r) {
    const Peer &peer = peers_.at(r - 1);
    if (peer.fd < 0)
      return makeError("rank 0: the group stopped after an earlier error");
    CallHeader theirs;
    if (auto err = recvAll(peer, &theirs, sizeof theirs, deadline()))
      return err;
    if (theirs.magic != kCall)
      return makeError("rank {} sent what is not a tgc collective", r);
    if (!(theirs == h)) { // its data is not read: the group ends after the statuses
      if (failure.empty())
        failure = fmt::format("rank {} called another collective than rank 0, or with another count or reduction", r);
      continue;
    }
    inputs[r].resize(inputCount(h, ranks_));
    if (auto err = recvAll(peer, inputs[r].data(), inputs[r].size() * 4, deadline()))
      return err;
    pointers[r] = inputs[r].data();
  }
  for (int r = 1; r < ranks_; ++r)
    if (auto err = sendStatus(peers_[r - 1], failure, deadline()))
      return err;
  if (!failure.empty())
    return makeError("rank 0: {}", failure);
  size_t part = h.count / size_t(ranks_);
  // Each rank's result, rank 0's last (all_reduce's is in place: every input read first).
  for (int r = ranks_ - 1; r >= 0; --r) {
    std::vector<float> result(outputCount(h, ranks_));
    for (size_t i = 0; i < result.size(); ++i) {
      if (h.kind == AllGather)
        result[i] = pointers[i / part][i % part];
      else
        result[i] = reduceInRankOrder(pointers.data(), size_t(ranks_), h.kind == ReduceScatter ? r * part + i : i,
                                      ReduceOp(h.op));
    }
    if (r == 0)
      std::copy(result.begin(), result.end(), out);
    else if (auto err = sendAll(peers_[r - 1], result.data(), result.size() * 4, deadline()))
      return err;
  }
  return llvm::Error::success();
}

struct Hello {
  uint32_t magic = kHello;
  int32_t rank = 0, ranks = 0;
};

/// Rank 0: listens on the port, takes every other rank's hello, answers each with the payload.
llvm::Expected<std::vector<Peer>> gather(Rendezvous &r, Clock::time_point until) {
  Peer listener{::socket(AF_INET, SOCK_STREAM, 0), fmt::format("rank 0 listening on port {}", r.port)};
  std::vector<Peer> peers(size_t(r.ranks - 1));
  auto fail = [&](std::string message) {
    closeAll(peers);
    ::close(listener.fd);
    return makeError("{}", message);
  };
  int on = 1;
  ::setsockopt(listener.fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof on);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_ANY);
  address.sin_port = htons(uint16_t(r.port));
  if (::bind(listener.fd, reinterpret_cast<sockaddr *>(&address), sizeof address) != 0 || ::listen(listener.fd, 64) != 0)
    return fail(fmt::format("rank 0 cannot listen on port {}: {}", r.port, std::strerror(errno)));
  for (int joined = 0; joined < r.ranks - 1;) {
    if (auto err = waitFor(listener, POLLIN, until, "heard")) {
      llvm::consumeError(std::move(err));
      return fail(fmt::format("rank 0: {} of the other {} ranks joined on port {} within {} s", joined, r.ranks - 1,
                              r.port, r.timeoutSeconds));
    }
    sockaddr_in from{};
    socklen_t size = sizeof from;
    Peer peer{::accept(listener.fd, reinterpret_cast<sockaddr *>(&from), &size), ""};
    if (peer.fd < 0)
      continue;
    char host[INET_ADDRSTRLEN] = "?";
    ::inet_ntop(AF_INET, &from.sin_addr, host, sizeof host);
    peer.name = fmt::format("a peer at {}", host);
    Hello hello; // (a connection that says nothing for 5 s is not a rank: dropped)
    auto helloBy = std::min(until, Clock::now() + std::chrono::seconds(5));
    if (auto err = recvAll(peer, &hello, sizeof hello, helloBy); err || hello.magic != kHello) {
      llvm::consumeError(std::move(err));
      ::close(peer.fd); // not a tgc rank
      continue;
    }
    std::string problem;
    if (hello.ranks != r.ranks)
      problem = fmt::format("rank {} at {} was started for {} ranks, rank 0 for {}", hello.rank, host, hello.ranks, r.ranks);
    else if (hello.rank < 1 || hello.rank >= r.ranks || peers[size_t(hello.rank - 1)].fd >= 0)
      problem = fmt::format("a second rank {} joined from {}", hello.rank, host);
    if (!problem.empty()) {
      llvm::consumeError(sendStatus(peer, problem, until));
      ::close(peer.fd);
      return fail("rank 0: " + problem);
    }
    peer.name = fmt::format("rank {} ({})", hello.rank, host);
    int noDelay = 1;
    ::setsockopt(peer.fd, IPPROTO_TCP, TCP_NODELAY, &noDelay, sizeof noDelay);
    peers[size_t(hello.rank - 1)] = peer;
    ++joined;
  }
  ::close(listener.fd);
  for (Peer &peer : peers) {
    uint32_t size = uint32_t(r.payload.size());
    llvm::Error err = sendStatus(peer, "", until);
    if (!err)
      err = sendAll(peer, &size, sizeof size, until);
    if (!err)
      err = sendAll(peer, r.payload.data(), size, until);
    if (err)
      return fail("rank 0: " + llvm::toString(std::move(err)));
  }
  return peers;
}

/// The other ranks: connect to rank 0 (again until it listens), say who they are, take the
/// payload.
llvm::Expected<std::vector<Peer>> join(Rendezvous &r, Clock::time_point until) {
  addrinfo hints{}, *found = nullptr;
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  if (int e = ::getaddrinfo(r.host.c_str(), std::to_string(r.port).c_str(), &hints, &found); e != 0)
    return makeError("rank {}: cannot resolve rank 0's host '{}': {}", r.rank, r.host, ::gai_strerror(e));
  std::unique_ptr<addrinfo, void (*)(addrinfo *)> guard(found, ::freeaddrinfo);
  Peer root{-1, fmt::format("rank 0 at {}:{}", r.host, r.port)};
  for (;;) {
    root.fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (::connect(root.fd, found->ai_addr, found->ai_addrlen) == 0)
      break;
    int e = errno;
    ::close(root.fd);
    if (Clock::now() >= until)
      return makeError("rank {}: {} did not answer within {} s: {}", r.rank, root.name, r.timeoutSeconds,
                       std::strerror(e));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  int noDelay = 1;
  ::setsockopt(root.fd, IPPROTO_TCP, TCP_NODELAY, &noDelay, sizeof noDelay);
  std::vector<Peer> peers{root};
  Hello hello{kHello, r.rank, r.ranks};
  llvm::Error err = sendAll(root, &hello, sizeof hello, until);
  if (!err)
    err = recvStatus(root, until);
  uint32_t size = 0;
  if (!err)
    err = recvAll(root, &size, sizeof size, until);
  if (!err && size > 4096)
    err = makeError("{} sent {} bytes of payload: not a tgc rank 0", root.name, size);
  if (!err) {
    r.payload.assign(size, '\0');
    err = recvAll(root, r.payload.data(), size, until);
  }
  if (err) {
    closeAll(peers);
    return makeError("rank {}: {}", r.rank, llvm::toString(std::move(err)));
  }
  return peers;
}

} // namespace

llvm::Expected<std::unique_ptr<Communicator>> joinTcpGroup(Rendezvous &r) {
  if (r.ranks < 1 || r.rank < 0 || r.rank >= r.ranks)
    return makeError("rank {} of {} ranks: the rank must be in [0, {})", r.rank, r.ranks, r.ranks);
  if (r.port < 1 || r.port > 65535)
    return makeError("the rendezvous port must be 1 to 65535, got {}", r.port);
  auto until = Clock::now() + std::chrono::milliseconds(int64_t(r.timeoutSeconds * 1000));
  std::vector<Peer> peers;
  if (r.ranks > 1) {
    auto joined = r.rank == 0 ? gather(r, until) : join(r, until);
    if (!joined)
      return joined.takeError();
    peers = std::move(*joined);
  }
  return std::make_unique<TcpRank>(r.rank, r.ranks, r.timeoutSeconds, std::move(peers));
}

} // namespace tgc
