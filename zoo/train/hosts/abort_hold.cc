// The SIGABRT handler of zoo.train.abort_hold: it holds a C++ abort of one process of a
// multi-process run until the lost-host watch (a Python thread) has said which process was
// lost, using only async-signal-safe calls (write, clock_gettime, nanosleep, socket, connect,
// poll, close, _exit, sigaction, raise), so it needs neither the GIL nor a live interpreter:
// it cannot wait on a thread that holds the GIL, and runs the same after Python's finalization.
//
// While it holds, a process other than 0 probes the coordinator's address once a second; when
// nothing answers there, no verdict can come (the service went with process 0), and the handler
// writes the line naming the lost coordinator and exits. Otherwise, once `hold_s` has passed,
// or as soon as Python says the process is exiting, the abort goes ahead as it would have.

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

namespace {

volatile sig_atomic_t exiting = 0;  // the process is on its way out: abort at once
volatile sig_atomic_t holding = 0;  // one thread's abort holds; a second one waits with it
double hold_s = 0;
int companion_fd = -1;           // told "x" before the exit the handler makes itself
int exit_code = 1;
sockaddr_in coordinator{};       // port 0: no probe (process 0, or no address)
char held_text[1024];            // "process K of N: aborted from C++ ...": the hold begins
char refused_text[1024];         // the lost-coordinator line, connection refused
char silent_text[1024];          // the lost-coordinator line, no answer within a second
char own_text[1024];             // no verdict came: the abort is the process's own

void say(const char* text) {
  size_t left = strlen(text);
  while (left > 0) {
    ssize_t n = write(2, text, left);
    if (n <= 0 && errno != EINTR) return;
    if (n > 0) {
      text += n;
      left -= static_cast<size_t>(n);
    }
  }
}

double now_s() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

void sleep_s(double seconds) {
  timespec t{static_cast<time_t>(seconds), static_cast<long>((seconds - (time_t)seconds) * 1e9)};
  while (nanosleep(&t, &t) != 0 && errno == EINTR) {
  }
}

// 0: the coordinator accepts a connection; 1: refused; 2: no answer within timeout_ms.
int probe(int timeout_ms) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  if (fd < 0) return 0;  // cannot tell: assume it is there
  int verdict = 0;
  if (connect(fd, reinterpret_cast<sockaddr*>(&coordinator), sizeof coordinator) != 0) {
    if (errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      int ready = poll(&p, 1, timeout_ms);
      if (ready == 0) {
        verdict = 2;
      } else {
        int error = 0;
        socklen_t size = sizeof error;
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &size);
        verdict = error == 0 ? 0 : (error == ECONNREFUSED ? 1 : 2);
      }
    } else {
      verdict = errno == ECONNREFUSED ? 1 : 2;
    }
  }
  close(fd);
  return verdict;
}

void leave(const char* line) {
  if (companion_fd >= 0) {
    ssize_t ignored = write(companion_fd, "x", 1);
    (void)ignored;
  }
  say(line);
  _exit(exit_code);
}

void abort_now() {
  struct sigaction plain{};
  plain.sa_handler = SIG_DFL;
  sigemptyset(&plain.sa_mask);
  sigaction(SIGABRT, &plain, nullptr);
  sigset_t abrt;
  sigemptyset(&abrt);
  sigaddset(&abrt, SIGABRT);
  sigprocmask(SIG_UNBLOCK, &abrt, nullptr);
  raise(SIGABRT);
  _exit(128 + SIGABRT);  // not reached
}

void held(int) {
  if (exiting) abort_now();
  if (holding) {  // another thread's abort holds already (gloo, then the agent)
    for (;;) sleep_s(1.0);
  }
  holding = 1;
  say(held_text);
  double deadline = now_s() + hold_s;
  while (now_s() < deadline && !exiting) {
    // The lost-host watch exits the process from its own thread; only the coordinator's own
    // loss is seen from here (the watch's queries then hang).
    if (coordinator.sin_port != 0) {
      int verdict = probe(1000);
      if (verdict == 1) leave(refused_text);
      if (verdict == 2) leave(silent_text);
    }
    sleep_s(1.0);
  }
  if (!exiting) say(own_text);
  abort_now();
}

void copy(char* to, const char* from) {
  strncpy(to, from, 1023);
  to[1023] = '\0';
}

}  // namespace

extern "C" {

// Installs the handler; `ipv4` in network order (0 with port 0: no probe). Returns 0, or errno.
int zoo_abort_hold_install(double hold_seconds, int companion, int code, unsigned ipv4,
                           unsigned short port, const char* held_line, const char* refused_line,
                           const char* silent_line, const char* own_line) {
  hold_s = hold_seconds;
  companion_fd = companion;
  exit_code = code;
  coordinator.sin_family = AF_INET;
  coordinator.sin_addr.s_addr = ipv4;
  coordinator.sin_port = htons(port);
  copy(held_text, held_line);
  copy(refused_text, refused_line);
  copy(silent_text, silent_line);
  copy(own_text, own_line);
  exiting = 0;
  struct sigaction action{};
  action.sa_handler = held;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_NODEFER;  // a second thread's abort enters too, and waits
  return sigaction(SIGABRT, &action, nullptr) == 0 ? 0 : errno;
}

// The process exits on its own terms from now on: an abort goes ahead at once.
void zoo_abort_hold_exiting() { exiting = 1; }

}  // extern "C"
