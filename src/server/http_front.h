// The connection layer in front of cpp-httplib's request handling.
//
// cpp-httplib (0.11, Debian 12) gives every connection a worker thread for as long as it is open
// and bounds only the wait for each single byte, so a client that sends its request one byte a
// second holds a worker indefinitely, and a hundred such clients starve everyone (slowloris). A
// body's declared length is also checked only after the body has been read. Here one poll thread
// reads every request's head and body without blocking; a request takes a worker only once it has
// fully arrived, and is handed to httplib from memory. What is bounded, each with a clear answer:
//   - the wait for a kept-alive connection's next request (idle_timeout, then closed),
//   - the time from a request's first byte to its last (request_timeout, then 408),
//   - the head's size (max_head_bytes, 431) and the declared body's (max_body_bytes: 413 at once,
//     before any of it is read; the body that follows is then read and thrown away, up to
//     max_discard_bytes, so that a client that sends its whole body before reading gets the 413
//     rather than a reset connection); chunked request bodies are refused (411),
//   - the connections held (max_connections): a new client evicts the longest-waiting incomplete
//     request, so slow clients cannot lock new ones out; with none to evict, the new one gets 503,
//   - each write of a response (write_timeout), so a client that stops reading is dropped.
#pragma once

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace flashmap::server {

struct FrontOptions {
  int workers = 16;  // threads that run complete requests (a streaming response holds one)
  size_t max_body_bytes = 4u << 20;
  // After a 413, the declared body is read and discarded when it is at most this long (within
  // request_timeout); a longer one is not waited for (the connection closes at once).
  size_t max_discard_bytes = 64u << 20;
  size_t max_head_bytes = 64u << 10;
  std::chrono::milliseconds idle_timeout{5000};
  std::chrono::milliseconds request_timeout{10000};
  std::chrono::milliseconds write_timeout{10000};
  int max_connections = 512;  // well under FD_SETSIZE: httplib answers 500 to sockets past it
  int max_requests_per_connection = 1000;
  // The body of an error answered by the front itself (status, message, code): the server's
  // OpenAI-style JSON.
  std::function<std::string(int, const std::string&, const std::string&)> error_body;
};

// Counts of what the front refused or cut, for /metrics.
struct FrontStats {
  uint64_t connections = 0;        // accepted
  uint64_t timed_out_idle = 0;     // kept-alive connections closed for silence
  uint64_t timed_out_request = 0;  // 408: a request that did not arrive in time
  uint64_t evicted = 0;            // incomplete requests dropped for a new connection
  uint64_t refused_busy = 0;       // 503: connection limit with nothing to evict
  uint64_t refused_head = 0;       // 431
  uint64_t refused_body = 0;       // 413 on the declared length
  uint64_t refused_malformed = 0;  // 400 / 411 from the framing checks
  int open = 0;                    // connections held now
};

// What the bytes a connection has sent so far say about its next request: the head's framing
// checks, without a socket (the front's poll thread, and the fuzzing harness, use it).
struct Framing {
  enum class Kind { Incomplete, Complete, Refuse };
  Kind kind = Kind::Incomplete;
  // Refuse: the answer (400, 411, 413 or 431), its message and error code.
  int status = 0;
  std::string message, code;
  // Complete, and a 413: the head's length (through its blank line) and the declared body's.
  size_t head_bytes = 0;
  uint64_t body_bytes = 0;
  // "Expect: 100-continue": where that header line is in the head (offset and length with its
  // CRLF), to be answered by the front and removed before httplib reads the head.
  bool expect_continue = false;
  size_t expect_at = 0, expect_len = 0;
};
Framing frame_request(std::string_view buf, size_t max_head_bytes, size_t max_body_bytes);

class HttpFront : public httplib::Server {
 public:
  explicit HttpFront(FrontOptions options);
  ~HttpFront() override;
  HttpFront(const HttpFront&) = delete;
  HttpFront& operator=(const HttpFront&) = delete;

  // Starts the poll thread and the workers; call before listen_after_bind().
  void start();
  // Closes every connection and joins the threads (after httplib's stop()); idempotent.
  void shutdown();
  FrontStats stats() const;

 private:
  using TimePoint = std::chrono::steady_clock::time_point;
  struct Conn {
    int fd = -1;
    std::string buf;  // received bytes not yet handed to httplib
    size_t need = 0;  // bytes of the complete request at the front of buf; 0: head incomplete
    TimePoint since;  // start of the current wait (accepted, or last response written)
    TimePoint deadline;
    bool started = false;  // the current request's first byte has arrived
    int served = 0;
    // Answered (413) and half-closed: the rest of its declared body is read and dropped, then
    // the connection closes.
    bool draining = false;
    uint64_t discard = 0;
  };
  // httplib's accept loop calls this (through an inline task queue) for every new socket.
  bool process_and_close_socket(socket_t sock) override;

  void poll_loop();
  void worker_loop();
  void admit(Conn c);  // under mutex_
  // Reads what is there; returns false when the connection is finished with (closed here).
  bool read_some(Conn& c);
  // Parses the head once complete; false when the request was refused and closed here (a 413
  // whose body is then drained keeps its connection: true, c.draining).
  bool frame(Conn& c);
  // Sends the answer and half-closes; the caller reads what is left of the request, or closes.
  void answer_and_shut(Conn& c, int status, const std::string& message, const std::string& code);
  void refuse(Conn& c, int status, const std::string& message, const std::string& code);
  void close_conn(Conn& c);
  void serve_one(Conn c);

  FrontOptions opt_;
  mutable std::mutex mutex_;
  std::condition_variable ready_cv_;
  std::list<Conn> waiting_;     // poll thread: requests still arriving
  std::deque<Conn> ready_;      // complete requests for the workers
  std::vector<Conn> incoming_;  // accepted or kept alive, not yet seen by the poll thread
  int wake_[2] = {-1, -1};
  bool stopping_ = false;
  FrontStats stats_;
  std::thread poller_;
  std::vector<std::thread> workers_;
};

}  // namespace flashmap::server
