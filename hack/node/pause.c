/* The real node's sandbox ("pause") image: holds a pod's namespaces open until told to stop, and
 * reaps orphaned children (it is PID 1 of the pod when the PID namespace is shared). Built static
 * by hack/node.sh into a `from scratch` image, because no registry is reachable to pull one. */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) { (void)sig; _exit(0); }

static void reap(int sig) {
  (void)sig;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

int main(void) {
  struct sigaction term = {.sa_handler = stop};
  struct sigaction chld = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP};
  if (sigaction(SIGINT, &term, NULL) < 0 || sigaction(SIGTERM, &term, NULL) < 0 ||
      sigaction(SIGCHLD, &chld, NULL) < 0)
    return 1;
  for (;;) pause();
}
