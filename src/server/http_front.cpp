#include "server/http_front.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <string_view>

#include "core/check.h"

namespace flashmap::server {

namespace {

using Clock = std::chrono::steady_clock;

// Runs httplib's per-connection task on the accepting thread: it only hands the socket to the
// poll thread, so it never blocks the accept loop.
class InlineQueue : public httplib::TaskQueue {
 public:
  void enqueue(std::function<void()> fn) override { fn(); }
  void shutdown() override {}
};

int ms_until(Clock::time_point t) {
  const auto d = std::chrono::duration_cast<std::chrono::milliseconds>(t - Clock::now()).count();
  return int(std::clamp<int64_t>(d, 0, 1000));
}

// Waits for `events` on fd until `deadline`; true when ready.
bool wait_fd(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int left = ms_until(deadline);
    const int r = ::poll(&p, 1, left);
    if (r > 0) return true;
    if (r < 0 && errno != EINTR) return false;
    if (r == 0 && Clock::now() >= deadline) return false;
  }
}

void peer_name(int fd, bool local, std::string& ip, int& port) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  const int r = local ? getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len)
                      : getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ip.clear();
  port = 0;
  if (r != 0) return;
  char text[INET6_ADDRSTRLEN] = {};
  if (addr.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&addr);
    inet_ntop(AF_INET, &a->sin_addr, text, sizeof(text));
    port = ntohs(a->sin_port);
  } else if (addr.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&addr);
    inet_ntop(AF_INET6, &a->sin6_addr, text, sizeof(text));
    port = ntohs(a->sin6_port);
  }
  ip = text;
}

// httplib's view of a connection whose request is already in memory: reads come from the
// buffer first (the socket only for what a malformed request asks beyond it, until the
// deadline), writes go to the socket with a bounded wait for room.
class BufferedStream : public httplib::Stream {
 public:
  BufferedStream(int fd, std::string buf, Clock::time_point read_deadline,
                 std::chrono::milliseconds write_timeout)
      : fd_(fd),
        buf_(std::move(buf)),
        read_deadline_(read_deadline),
        write_timeout_(write_timeout) {}

  bool is_readable() const override {
    return pos_ < buf_.size() || wait_fd(fd_, POLLIN, read_deadline_);
  }
  bool is_writable() const override { return wait_fd(fd_, POLLOUT, Clock::now() + write_timeout_); }
  ssize_t read(char* ptr, size_t size) override {
    if (pos_ < buf_.size()) {
      const size_t n = std::min(size, buf_.size() - pos_);
      std::memcpy(ptr, buf_.data() + pos_, n);
      pos_ += n;
      return ssize_t(n);
    }
    for (;;) {
      const ssize_t n = ::recv(fd_, ptr, size, MSG_DONTWAIT);
      if (n >= 0) return n;
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) return -1;
      if (!wait_fd(fd_, POLLIN, read_deadline_)) return -1;
    }
  }
  ssize_t write(const char* ptr, size_t size) override {
    size_t sent = 0;
    while (sent < size) {
      const ssize_t n = ::send(fd_, ptr + sent, size - sent, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n > 0) {
        sent += size_t(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return -1;
      if (!wait_fd(fd_, POLLOUT, Clock::now() + write_timeout_)) return -1;
    }
    return ssize_t(size);
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    peer_name(fd_, false, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    peer_name(fd_, true, ip, port);
  }
  socket_t socket() const override { return fd_; }
  // What httplib did not read (a pipelined next request).
  std::string rest() && { return buf_.substr(std::min(pos_, buf_.size())); }

 private:
  int fd_;
  std::string buf_;
  size_t pos_ = 0;
  Clock::time_point read_deadline_;
  std::chrono::milliseconds write_timeout_;
};

const char* reason_phrase(int status) {
  switch (status) {
    case 400:
      return "Bad Request";
    case 408:
      return "Request Timeout";
    case 411:
      return "Length Required";
    case 413:
      return "Payload Too Large";
    case 431:
      return "Request Header Fields Too Large";
    case 503:
      return "Service Unavailable";
    default:
      return "Error";
  }
}

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

}  // namespace

HttpFront::HttpFront(FrontOptions options) : opt_(std::move(options)) {
  FLASHMAP_CHECK(opt_.workers >= 1, "the HTTP front needs at least one worker");
  new_task_queue = [] { return new InlineQueue; };
  set_payload_max_length(opt_.max_body_bytes);
  // What httplib advertises in Keep-Alive headers; the front enforces them.
  set_keep_alive_max_count(size_t(opt_.max_requests_per_connection));
  set_keep_alive_timeout(std::max<time_t>(1, time_t(opt_.idle_timeout.count() / 1000)));
  FLASHMAP_CHECK(::pipe(wake_) == 0, "cannot create the HTTP front's wake-up pipe: {}",
                 std::strerror(errno));
}

HttpFront::~HttpFront() {
  shutdown();
  ::close(wake_[0]);
  ::close(wake_[1]);
}

void HttpFront::start() {
  poller_ = std::thread([this] { poll_loop(); });
  for (int i = 0; i < opt_.workers; ++i) workers_.emplace_back([this] { worker_loop(); });
}

void HttpFront::shutdown() {
  {
    std::lock_guard lk(mutex_);
    if (stopping_) return;
    stopping_ = true;
  }
  const char b = 1;
  [[maybe_unused]] auto w = ::write(wake_[1], &b, 1);
  ready_cv_.notify_all();
  if (poller_.joinable()) poller_.join();
  for (auto& t : workers_)
    if (t.joinable()) t.join();
  std::lock_guard lk(mutex_);
  for (auto& c : incoming_) ::close(c.fd);
  for (auto& c : ready_) ::close(c.fd);
  incoming_.clear();
  ready_.clear();
}

FrontStats HttpFront::stats() const {
  std::lock_guard lk(mutex_);
  return stats_;
}

bool HttpFront::process_and_close_socket(socket_t sock) {
  Conn c;
  c.fd = sock;
  c.since = Clock::now();
  c.deadline = c.since + opt_.idle_timeout;
  {
    std::lock_guard lk(mutex_);
    if (stopping_) {
      ::close(sock);
      return false;
    }
    ++stats_.connections;
    ++stats_.open;
    incoming_.push_back(std::move(c));
  }
  const char b = 1;
  [[maybe_unused]] auto w = ::write(wake_[1], &b, 1);
  return true;
}

void HttpFront::close_conn(Conn& c) {
  if (c.fd < 0) return;
  ::close(c.fd);
  c.fd = -1;
  std::lock_guard lk(mutex_);
  --stats_.open;
}

void HttpFront::answer_and_shut(Conn& c, int status, const std::string& message,
                                const std::string& code) {
  const std::string body = opt_.error_body ? opt_.error_body(status, message, code) : message;
  const std::string head = fmt::format(
      "HTTP/1.1 {} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n"
      "Connection: close\r\n\r\n",
      status, reason_phrase(status), body.size());
  // Best effort: a client that does not read gets its connection closed all the same.
  const std::string all = head + body;
  [[maybe_unused]] auto n = ::send(c.fd, all.data(), all.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  ::shutdown(c.fd, SHUT_WR);
}

void HttpFront::refuse(Conn& c, int status, const std::string& message, const std::string& code) {
  answer_and_shut(c, status, message, code);
  // Let the client read the answer before the socket goes (closing with unread request bytes
  // would reset the connection and could discard the answer).
  char sink[4096];
  for (int i = 0; i < 16 && ::recv(c.fd, sink, sizeof(sink), MSG_DONTWAIT) > 0; ++i) {
  }
  close_conn(c);
}

Framing frame_request(std::string_view buf, size_t max_head_bytes, size_t max_body_bytes) {
  Framing f;
  auto refuse = [&](int status, std::string message, std::string code) {
    f.kind = Framing::Kind::Refuse;
    f.status = status;
    f.message = std::move(message);
    f.code = std::move(code);
    return f;
  };
  // The head runs through its blank line. It is over the limit when it ends past it, or when
  // as many bytes came without its end (which could now end one byte later at the earliest):
  // the same answer however the bytes were split into reads.
  const size_t end = buf.find("\r\n\r\n");
  if (end == std::string_view::npos ? buf.size() >= max_head_bytes : end + 4 > max_head_bytes)
    return refuse(431, fmt::format("the request head exceeds {} bytes", max_head_bytes),
                  "request_head_too_large");
  if (end == std::string_view::npos) return f;
  f.head_bytes = end + 4;
  const std::string_view head = buf.substr(0, end);
  std::optional<uint64_t> length;
  size_t at = head.find("\r\n");  // skip the request line
  while (at != std::string_view::npos && at < head.size()) {
    const size_t start = at + 2;
    size_t stop = head.find("\r\n", start);
    if (stop == std::string_view::npos) stop = head.size();
    const std::string_view line = head.substr(start, stop - start);
    const size_t colon = line.find(':');
    if (colon != std::string_view::npos) {
      const std::string_view name = trim(line.substr(0, colon)),
                             value = trim(line.substr(colon + 1));
      if (iequals(name, "content-length")) {
        uint64_t v = 0;
        const bool digits =
            !value.empty() && value.size() <= 18 &&
            std::all_of(value.begin(), value.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
        if (digits)
          for (char ch : value) v = v * 10 + uint64_t(ch - '0');
        if (!digits || (length && *length != v))
          return refuse(400, "the request has an invalid Content-Length", "invalid_request");
        length = v;
      } else if (iequals(name, "transfer-encoding")) {
        return refuse(411, "chunked request bodies are not supported: send a Content-Length",
                      "length_required");
      } else if (iequals(name, "expect") && iequals(value, "100-continue")) {
        f.expect_continue = true;
        f.expect_at = start;
        f.expect_len = stop + 2 - start;
      }
    }
    at = stop;
  }
  f.body_bytes = length.value_or(0);
  if (f.body_bytes > max_body_bytes)
    return refuse(413,
                  fmt::format("the request body ({} bytes declared) exceeds {} bytes",
                              f.body_bytes, max_body_bytes),
                  "request_too_large");
  f.kind = Framing::Kind::Complete;
  return f;
}

bool HttpFront::frame(Conn& c) {
  const Framing f = frame_request(c.buf, opt_.max_head_bytes, opt_.max_body_bytes);
  if (f.kind == Framing::Kind::Incomplete) return true;
  if (f.kind == Framing::Kind::Refuse) {
    {
      std::lock_guard lk(mutex_);
      ++(f.status == 431   ? stats_.refused_head
         : f.status == 413 ? stats_.refused_body
                           : stats_.refused_malformed);
    }
    // A client that sends its whole body before reading (most do, without Expect) would find
    // the connection reset under it if it closed now: the 413 goes first, then the body is read
    // and dropped. One that waits for 100 Continue sends nothing more.
    const uint64_t arrived = c.buf.size() - std::min(c.buf.size(), f.head_bytes);
    if (f.status == 413 && !f.expect_continue && f.body_bytes - arrived <= opt_.max_discard_bytes) {
      answer_and_shut(c, f.status, f.message, f.code);
      c.draining = true;
      c.discard = f.body_bytes - std::min(f.body_bytes, arrived);
      c.buf.clear();
      c.deadline = Clock::now() + opt_.request_timeout;
      if (c.discard == 0) {
        close_conn(c);
        return false;
      }
      return true;
    }
    refuse(c, f.status, f.message, f.code);
    return false;
  }
  size_t head_size = f.head_bytes;
  if (f.expect_continue) {
    // The client waits for this before sending the body; the header goes so that httplib does
    // not answer it a second time.
    c.buf.erase(f.expect_at, f.expect_len);
    head_size -= f.expect_len;
    if (f.body_bytes > 0 && c.buf.size() < head_size + f.body_bytes) {
      static constexpr char kContinue[] = "HTTP/1.1 100 Continue\r\n\r\n";
      [[maybe_unused]] auto n =
          ::send(c.fd, kContinue, sizeof(kContinue) - 1, MSG_DONTWAIT | MSG_NOSIGNAL);
    }
  }
  c.need = head_size + size_t(f.body_bytes);
  return true;
}

bool HttpFront::read_some(Conn& c) {
  char tmp[16384];
  for (;;) {
    const ssize_t n = ::recv(c.fd, tmp, sizeof(tmp), MSG_DONTWAIT);
    if (n == 0) {
      close_conn(c);
      return false;
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
      close_conn(c);
      return false;
    }
    if (c.draining) {
      // The rest of a refused body: dropped; the connection closes once all of it came.
      c.discard -= std::min<uint64_t>(c.discard, uint64_t(n));
      if (c.discard == 0) {
        close_conn(c);
        return false;
      }
      continue;
    }
    if (!c.started) {
      c.started = true;
      c.deadline = Clock::now() + opt_.request_timeout;
    }
    c.buf.append(tmp, size_t(n));
    if (c.need == 0 && !frame(c)) return false;
    // Enough for this request: the rest (if any) is read by httplib or kept for the next.
    if (c.need > 0 && c.buf.size() >= c.need) return true;
    if (size_t(n) < sizeof(tmp)) return true;
  }
}

void HttpFront::poll_loop() {
  std::vector<pollfd> fds;
  for (;;) {
    std::vector<Conn> fresh;
    {
      std::lock_guard lk(mutex_);
      if (stopping_) break;
      fresh.swap(incoming_);
    }
    for (auto& c : fresh) {
      // Over the limit: the connection that has waited longest for its request to arrive
      // makes room; a slow client cannot hold the door shut for a new one.
      bool over;
      {
        std::lock_guard lk(mutex_);
        over = stats_.open > opt_.max_connections;
      }
      if (over) {
        auto oldest =
            std::min_element(waiting_.begin(), waiting_.end(),
                             [](const Conn& a, const Conn& b) { return a.since < b.since; });
        if (oldest != waiting_.end()) {
          {
            std::lock_guard lk(mutex_);
            ++stats_.evicted;
          }
          // A kept-alive connection between requests just closes (an answer would be read as
          // the reply to its next request); a request in progress hears why.
          if (oldest->started && !oldest->draining)
            refuse(*oldest, 503, "connection dropped: the server is at its connection limit",
                   "too_many_connections");
          else
            close_conn(*oldest);
          waiting_.erase(oldest);
        } else {
          {
            std::lock_guard lk(mutex_);
            ++stats_.refused_busy;
          }
          refuse(c, 503, "the server is at its connection limit", "too_many_connections");
          continue;
        }
      }
      // A kept-alive connection may already hold its next (pipelined) request.
      if (!c.buf.empty() && c.need == 0 && !frame(c)) continue;
      waiting_.push_back(std::move(c));
    }

    // Complete requests go to the workers.
    for (auto it = waiting_.begin(); it != waiting_.end();) {
      if (it->need > 0 && it->buf.size() >= it->need) {
        {
          std::lock_guard lk(mutex_);
          ready_.push_back(std::move(*it));
        }
        ready_cv_.notify_one();
        it = waiting_.erase(it);
      } else {
        ++it;
      }
    }

    fds.assign(1, pollfd{wake_[0], POLLIN, 0});
    Clock::time_point next = Clock::now() + std::chrono::seconds(1);
    for (const auto& c : waiting_) {
      fds.push_back({c.fd, POLLIN, 0});
      next = std::min(next, c.deadline);
    }
    const int r = ::poll(fds.data(), nfds_t(fds.size()), ms_until(next));
    if (r < 0 && errno != EINTR) break;
    if (fds[0].revents) {
      char sink[256];
      [[maybe_unused]] auto n = ::read(wake_[0], sink, sizeof(sink));
    }
    size_t i = 1;
    const auto now = Clock::now();
    for (auto it = waiting_.begin(); it != waiting_.end(); ++i) {
      Conn& c = *it;
      if (fds[i].revents && !read_some(c)) {
        it = waiting_.erase(it);
        continue;
      }
      if (now >= c.deadline && !(c.need > 0 && c.buf.size() >= c.need)) {
        if (!c.draining) {  // a drained connection was answered already
          std::lock_guard lk(mutex_);
          ++(c.started ? stats_.timed_out_request : stats_.timed_out_idle);
        }
        if (c.started && !c.draining)
          refuse(
              c, 408,
              fmt::format("the request did not arrive within {} ms", opt_.request_timeout.count()),
              "request_timeout");
        else
          close_conn(c);
        it = waiting_.erase(it);
        continue;
      }
      ++it;
    }
  }
  for (auto& c : waiting_) close_conn(c);
  waiting_.clear();
}

void HttpFront::worker_loop() {
  for (;;) {
    Conn c;
    {
      std::unique_lock lk(mutex_);
      ready_cv_.wait(lk, [&] { return stopping_ || !ready_.empty(); });
      if (stopping_) return;
      c = std::move(ready_.front());
      ready_.pop_front();
    }
    serve_one(std::move(c));
  }
}

void HttpFront::serve_one(Conn c) {
  bool last;
  {
    std::lock_guard lk(mutex_);
    last = stopping_ || c.served + 1 >= opt_.max_requests_per_connection;
  }
  BufferedStream strm(c.fd, std::move(c.buf), Clock::now() + opt_.request_timeout,
                      opt_.write_timeout);
  bool closed = false, ok = false;
  try {
    ok = process_request(strm, last, closed, nullptr);
  } catch (...) {
    // httplib lets an exception from a streaming content provider escape; the connection is
    // then in an unknown state and goes.
    ok = false;
  }
  if (!ok || closed || last) {
    close_conn(c);
    return;
  }
  c.buf = std::move(strm).rest();
  c.need = 0;
  ++c.served;
  c.since = Clock::now();
  c.started = !c.buf.empty();
  c.deadline = c.since + (c.started ? opt_.request_timeout : opt_.idle_timeout);
  {
    std::lock_guard lk(mutex_);
    if (stopping_) {
      ::close(c.fd);
      --stats_.open;
      return;
    }
    incoming_.push_back(std::move(c));
  }
  const char b = 1;
  [[maybe_unused]] auto w = ::write(wake_[1], &b, 1);
}

}  // namespace flashmap::server
