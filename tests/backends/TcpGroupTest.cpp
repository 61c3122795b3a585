// Ranks as processes that meet over TCP (TcpGroup.h), here as threads on the loopback: the
// collectives give LocalGroup's bits on fresh random values, rank 0's payload reaches every
// rank, and what goes wrong in a run across hosts is one clear error on each rank, within the
// timeout: nobody listening, a rank that never comes, a rank started for another count, a rank
// that ends in the middle.
#include "backends/TcpGroup.h"
#include "support/Error.h"
#include "support/Random.h"
#include "tests/TestUtil.h"

#include <gtest/gtest.h>

#include <chrono>
#include <netinet/in.h>
#include <sys/socket.h>
#include <thread>
#include <unistd.h>

using namespace tgc;
using namespace tgc::test;

namespace {

/// A port nothing listens on now (the kernel's choice for a socket bound to port 0).
int freePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t size = sizeof address;
  ::bind(fd, reinterpret_cast<sockaddr *>(&address), size);
  ::getsockname(fd, reinterpret_cast<sockaddr *>(&address), &size);
  ::close(fd);
  return ntohs(address.sin_port);
}

/// `body(rank, communicator)` on each of `ranks` threads joined on `port`; each rank's error
/// (joining or the body's), or "".
template <typename Body>
std::vector<std::string> onTcpRanks(int ranks, int port, double timeout, Body body, std::string payload = "") {
  std::vector<std::string> errors(static_cast<size_t>(ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      Rendezvous rendezvous{"127.0.0.1", port, r, ranks, timeout, r == 0 ? payload : ""};
      auto group = joinTcpGroup(rendezvous);
      if (!group) {
        errors[size_t(r)] = llvm::toString(group.takeError());
        return;
      }
      if (rendezvous.payload != payload)
        errors[size_t(r)] = "payload '" + rendezvous.payload + "'";
      else if (llvm::Error err = body(r, **group))
        errors[size_t(r)] = llvm::toString(std::move(err));
    });
  for (std::thread &t : threads)
    t.join();
  return errors;
}

TEST(TcpGroup, CollectivesGiveLocalGroupsBits) {
  Rng rng(freshSeed());
  const int ranks = 3;
  const size_t count = 3 * 41;
  std::vector<std::vector<float>> in(ranks, std::vector<float>(count));
  for (auto &v : in)
    for (float &x : v)
      x = float(rng.normal());
  // What LocalGroup gives, then the same calls over TCP.
  auto run = [&](auto onRanks) {
    std::vector<std::vector<float>> results(ranks);
    auto errors = onRanks([&](int r, Communicator &c) -> llvm::Error {
      std::vector<float> &out = results[size_t(r)];
      for (ReduceOp op : {ReduceOp::Avg, ReduceOp::Sum, ReduceOp::Max}) {
        std::vector<float> data = in[size_t(r)];
        if (auto err = c.allReduceHost(data.data(), count, op))
          return err;
        out.insert(out.end(), data.begin(), data.end());
      }
      std::vector<float> part(count / ranks), whole(count);
      if (auto err = c.reduceScatterHost(in[size_t(r)].data(), part.data(), count, ReduceOp::Avg))
        return err;
      if (auto err = c.allGatherHost(part.data(), whole.data(), count))
        return err;
      out.insert(out.end(), part.begin(), part.end());
      out.insert(out.end(), whole.begin(), whole.end());
      return llvm::Error::success();
    });
    for (const std::string &e : errors)
      EXPECT_EQ(e, "");
    return results;
  };
  auto local = run([&](auto body) {
    LocalGroup group(ranks);
    std::vector<std::string> errors(static_cast<size_t>(ranks));
    std::vector<std::thread> threads;
    for (int r = 0; r < ranks; ++r)
      threads.emplace_back([&, r] {
        if (llvm::Error err = body(r, group.rank(r)))
          errors[size_t(r)] = llvm::toString(std::move(err));
      });
    for (std::thread &t : threads)
      t.join();
    return errors;
  });
  auto tcp = run([&](auto body) { return onTcpRanks(ranks, freePort(), 20, body, "the id"); });
  for (int r = 0; r < ranks; ++r) {
    ASSERT_EQ(tcp[r].size(), local[r].size());
    EXPECT_EQ(tcp[r], local[r]) << "rank " << r;
  }
}

TEST(TcpGroup, AStrangerAtThePortIsIgnored) {
  // Something that is not a tgc rank connects to rank 0's port first and sends other bytes:
  // rank 0 drops it and the group forms with the real rank.
  int port = freePort();
  std::string zero, one;
  std::thread root([&] {
    Rendezvous r{"127.0.0.1", port, 0, 2, 10, "id"};
    auto group = joinTcpGroup(r);
    zero = group ? "" : llvm::toString(group.takeError());
  });
  for (int tries = 0; tries < 100; ++tries) { // once rank 0 listens
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = htons(uint16_t(port));
    bool connected = ::connect(fd, reinterpret_cast<sockaddr *>(&address), sizeof address) == 0;
    if (connected) {
      const char request[] = "GET / HTTP/1.0\r\n\r\n";
      EXPECT_GT(::send(fd, request, sizeof request - 1, MSG_NOSIGNAL), 0);
    }
    ::close(fd);
    if (connected)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  Rendezvous r{"127.0.0.1", port, 1, 2, 10, ""};
  auto group = joinTcpGroup(r);
  one = group ? "" : llvm::toString(group.takeError());
  root.join();
  EXPECT_EQ(zero, "");
  EXPECT_EQ(one, "");
  EXPECT_EQ(r.payload, "id");
}

TEST(TcpGroup, WhatGoesWrongIsOneClearErrorWithinTheTimeout) {
  // Nobody listens: a rank gives up after the timeout, naming the address.
  int port = freePort();
  Rendezvous alone{"127.0.0.1", port, 1, 2, 0.5, ""};
  auto start = std::chrono::steady_clock::now();
  EXPECT_NE(errorOf(joinTcpGroup(alone)).find(fmt::format("rank 1: rank 0 at 127.0.0.1:{} did not answer within 0.5 s", port)),
            std::string::npos);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  // A rank that never comes.
  Rendezvous root{"127.0.0.1", freePort(), 0, 3, 0.5, ""};
  EXPECT_NE(errorOf(joinTcpGroup(root)).find("rank 0: 0 of the other 2 ranks joined on port"), std::string::npos);
  // A rank started for another count: both hear of it.
  port = freePort();
  std::string zero, one;
  std::thread a([&] {
    Rendezvous r{"127.0.0.1", port, 0, 2, 5, ""};
    zero = errorOf(joinTcpGroup(r));
  });
  std::thread b([&] {
    Rendezvous r{"127.0.0.1", port, 1, 3, 5, ""};
    one = errorOf(joinTcpGroup(r));
  });
  a.join();
  b.join();
  EXPECT_NE(zero.find("rank 1 at 127.0.0.1 was started for 3 ranks, rank 0 for 2"), std::string::npos) << zero;
  EXPECT_NE(one.find("was started for 3 ranks, rank 0 for 2"), std::string::npos) << one;
  // Mismatched calls: every rank says so.
  auto errors = onTcpRanks(2, freePort(), 5, [](int r, Communicator &c) {
    std::vector<float> data(4 + r);
    return c.allReduceHost(data.data(), data.size(), ReduceOp::Sum);
  });
  for (const std::string &e : errors)
    EXPECT_NE(e.find("rank 1 called another collective than rank 0, or with another count or reduction"),
              std::string::npos)
        << e;
  // A rank that ends in the middle of a run: the others' next collective fails, naming it.
  errors = onTcpRanks(3, freePort(), 5, [](int r, Communicator &c) -> llvm::Error {
    std::vector<float> data(8, 1.0f);
    if (auto err = c.allReduceHost(data.data(), 8, ReduceOp::Sum))
      return err;
    if (r == 2)
      return makeError("rank 2 stops");
    return c.allReduceHost(data.data(), 8, ReduceOp::Sum);
  });
  EXPECT_NE(errors[0].find("rank 2 (127.0.0.1) closed its connection"), std::string::npos) << errors[0];
  EXPECT_NE(errors[1].find("rank 0 at 127.0.0.1"), std::string::npos) << errors[1];
  EXPECT_EQ(errors[2], "rank 2 stops");
}

} // namespace
