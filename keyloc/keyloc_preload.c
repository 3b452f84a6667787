/* kvswitch's key-location shim: an LD_PRELOAD library that puts the key-location header in
 * front of the UDP datagrams an unchanged program sends to kvswitch's keyed ports, for
 * programs that cannot attach it themselves.
 *
 *   KVSWITCH_KEYLOC="5300:12:@00" LD_PRELOAD=libkvswitch_keyloc.so dig @10.0.0.100 -p 5300 x
 *
 * KVSWITCH_KEYLOC holds rules separated by commas, each PORT:START:END: datagrams to PORT (on
 * any address) have their key at payload byte START up to END, which is
 *   +N   N bytes;
 *   @HH  the first byte HH (hex) at or after START, or the payload's end;
 *   $    the payload's end.
 * "5300:12:@00" is a DNS query's name: from byte 12 to the zero that ends it. A datagram whose
 * key cannot be found (too short, empty, past 250 bytes) is sent without a header, and the
 * switch drops and counts it (bad_key_header). send, sendto, sendmsg, sendmmsg and write on
 * IPv4 UDP sockets are wrapped, and so is sendmmsg made through syscall(2), as libuv makes it
 * (dig, for one); everything else passes through untouched. A datagram sent in pieces
 * (MSG_MORE) passes untouched too; one the kernel segments itself (UDP_SEGMENT) or a corked
 * socket (UDP_CORK) would get one header for several datagrams, or several for one: programs
 * that use them are not served.
 *
 * Build: clang -O2 -shared -fPIC -o libkvswitch_keyloc.so keyloc_preload.c -ldl
 * (scripts/keyloc-shim.sh does it). The format is described in docs/keyloc.md. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#define HEADER_LEN 12
#define MAX_KEY 250
#define MAX_RULES 16
#define MAX_DATAGRAM 65507

enum end_kind { END_LEN, END_BYTE, END_PAYLOAD };

struct rule {
	uint16_t port;
	uint32_t start;
	enum end_kind kind;
	uint32_t arg;
};

static struct rule rules[MAX_RULES];
static int nrules = -1;

static ssize_t (*real_send)(int, const void *, size_t, int);
static ssize_t (*real_sendto)(int, const void *, size_t, int, const struct sockaddr *, socklen_t);
static ssize_t (*real_sendmsg)(int, const struct msghdr *, int);
static int (*real_sendmmsg)(int, struct mmsghdr *, unsigned int, int);
static ssize_t (*real_write)(int, const void *, size_t);
static long (*real_syscall)(long, ...);

static pthread_once_t once = PTHREAD_ONCE_INIT;

/* Finds the wrapped functions and reads KVSWITCH_KEYLOC, once, whichever thread comes first; a
 * rule that does not parse is skipped. */
static void init(void)
{
	real_send = dlsym(RTLD_NEXT, "send");
	real_sendto = dlsym(RTLD_NEXT, "sendto");
	real_sendmsg = dlsym(RTLD_NEXT, "sendmsg");
	real_sendmmsg = dlsym(RTLD_NEXT, "sendmmsg");
	real_write = dlsym(RTLD_NEXT, "write");
	real_syscall = dlsym(RTLD_NEXT, "syscall");
	const char *env = getenv("KVSWITCH_KEYLOC");
	if (!env) {
		nrules = 0;
		return;
	}
	char buf[512];
	strncpy(buf, env, sizeof buf - 1);
	buf[sizeof buf - 1] = 0;
	char *save = NULL;
	int n = 0;
	for (char *r = strtok_r(buf, ",", &save); r && n < MAX_RULES;
	     r = strtok_r(NULL, ",", &save)) {
		char *end;
		unsigned long port = strtoul(r, &end, 10);
		if (*end != ':' || port == 0 || port > 65535)
			continue;
		unsigned long start = strtoul(end + 1, &end, 10);
		if (*end != ':' || start > MAX_DATAGRAM)
			continue;
		char *spec = end + 1;
		struct rule rule = {.port = (uint16_t)port, .start = (uint32_t)start};
		if (spec[0] == '+') {
			unsigned long n = strtoul(spec + 1, &end, 10);
			if (*end || n == 0 || n > MAX_KEY)
				continue;
			rule.kind = END_LEN;
			rule.arg = (uint32_t)n;
		} else if (spec[0] == '@') {
			unsigned long b = strtoul(spec + 1, &end, 16);
			if (*end || end == spec + 1 || b > 255)
				continue;
			rule.kind = END_BYTE;
			rule.arg = (uint32_t)b;
		} else if (spec[0] == '$' && !spec[1]) {
			rule.kind = END_PAYLOAD;
		} else {
			continue;
		}
		rules[n++] = rule;
	}
	nrules = n;
}

static void load(void)
{
	int saved = errno;
	pthread_once(&once, init);
	errno = saved;
}

__attribute__((constructor)) static void load_early(void)
{
	load();
}

/* The rule for an IPv4 UDP socket sending to `to` (`tolen` bytes), or with no address to its
 * peer; errno is left as it was. */
static const struct rule *rule_lookup(int fd, const struct sockaddr *to, socklen_t tolen)
{
	if (nrules <= 0)
		return NULL;
	int type;
	socklen_t len = sizeof type;
	if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) || type != SOCK_DGRAM)
		return NULL;
	struct sockaddr_in peer;
	if (!to) {
		len = sizeof peer;
		if (getpeername(fd, (struct sockaddr *)&peer, &len))
			return NULL;
		to = (const struct sockaddr *)&peer;
		tolen = len;
	}
	if (tolen < (socklen_t)sizeof(struct sockaddr_in) || to->sa_family != AF_INET)
		return NULL;
	uint16_t port = ntohs(((const struct sockaddr_in *)to)->sin_port);
	for (int i = 0; i < nrules; i++)
		if (rules[i].port == port)
			return &rules[i];
	return NULL;
}

static const struct rule *rule_for(int fd, const struct sockaddr *to, socklen_t tolen, int flags)
{
	load();
	if (flags & MSG_MORE)
		return NULL;
	int saved = errno;
	const struct rule *r = rule_lookup(fd, to, tolen);
	errno = saved;
	return r;
}

/* Writes header + payload into `out` (room for HEADER_LEN + len); 0 when the key is not found. */
static int attach(const struct rule *r, const uint8_t *payload, size_t len, uint8_t *out)
{
	size_t start = r->start, end;
	if (start >= len)
		return 0;
	switch (r->kind) {
	case END_LEN:
		end = start + r->arg;
		break;
	case END_BYTE: {
		const uint8_t *at = memchr(payload + start, (int)r->arg, len - start);
		end = at ? (size_t)(at - payload) : len;
		break;
	}
	default:
		end = len;
	}
	if (end > len || end <= start || end - start > MAX_KEY)
		return 0;
	memcpy(out, "kvl\1", 4);
	uint32_t s = htonl((uint32_t)start), e = htonl((uint32_t)end);
	memcpy(out + 4, &s, 4);
	memcpy(out + 8, &e, 4);
	memcpy(out + HEADER_LEN, payload, len);
	return 1;
}

/* The datagram of `iov` in one buffer with its header, or NULL (send it as it is). */
static uint8_t *keyed(const struct rule *r, const struct iovec *iov, size_t n, size_t *out_len)
{
	size_t len = 0;
	for (size_t i = 0; i < n; i++) {
		if (iov[i].iov_len > MAX_DATAGRAM)
			return NULL; /* the kernel refuses it; so no sum can wrap */
		len += iov[i].iov_len;
		if (len > MAX_DATAGRAM - HEADER_LEN)
			return NULL;
	}
	uint8_t *flat = malloc(len ? len : 1), *out = malloc(HEADER_LEN + len);
	if (!flat || !out) {
		free(flat);
		free(out);
		return NULL;
	}
	size_t at = 0;
	for (size_t i = 0; i < n; i++) {
		memcpy(flat + at, iov[i].iov_base, iov[i].iov_len);
		at += iov[i].iov_len;
	}
	int ok = attach(r, flat, len, out);
	free(flat);
	if (!ok) {
		free(out);
		return NULL;
	}
	*out_len = HEADER_LEN + len;
	return out;
}

/* What the program is told was sent: its own bytes, not the header. */
static ssize_t sent(ssize_t n)
{
	return n >= HEADER_LEN ? n - HEADER_LEN : n;
}

ssize_t sendto(int fd, const void *buf, size_t len, int flags, const struct sockaddr *to,
	       socklen_t tolen)
{
	load();
	const struct rule *r = rule_for(fd, to, tolen, flags);
	struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
	size_t klen;
	uint8_t *k = r ? keyed(r, &iov, 1, &klen) : NULL;
	if (!k)
		return real_sendto(fd, buf, len, flags, to, tolen);
	ssize_t n = real_sendto(fd, k, klen, flags, to, tolen);
	int err = errno;
	free(k);
	errno = err;
	return sent(n);
}

ssize_t send(int fd, const void *buf, size_t len, int flags)
{
	load();
	const struct rule *r = rule_for(fd, NULL, 0, flags);
	struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
	size_t klen;
	uint8_t *k = r ? keyed(r, &iov, 1, &klen) : NULL;
	if (!k)
		return real_send(fd, buf, len, flags);
	ssize_t n = real_send(fd, k, klen, flags);
	int err = errno;
	free(k);
	errno = err;
	return sent(n);
}

ssize_t write(int fd, const void *buf, size_t len)
{
	load();
	const struct rule *r = rule_for(fd, NULL, 0, 0);
	struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
	size_t klen;
	uint8_t *k = r ? keyed(r, &iov, 1, &klen) : NULL;
	if (!k)
		return real_write(fd, buf, len);
	ssize_t n = real_write(fd, k, klen);
	int err = errno;
	free(k);
	errno = err;
	return sent(n);
}

ssize_t sendmsg(int fd, const struct msghdr *msg, int flags)
{
	load();
	const struct rule *r = rule_for(fd, msg->msg_name, msg->msg_namelen, flags);
	size_t klen;
	uint8_t *k = r ? keyed(r, msg->msg_iov, msg->msg_iovlen, &klen) : NULL;
	if (!k)
		return real_sendmsg(fd, msg, flags);
	struct msghdr m = *msg;
	struct iovec iov = {.iov_base = k, .iov_len = klen};
	m.msg_iov = &iov;
	m.msg_iovlen = 1;
	ssize_t n = real_sendmsg(fd, &m, flags);
	int err = errno;
	free(k);
	errno = err;
	return sent(n);
}

int sendmmsg(int fd, struct mmsghdr *msgs, unsigned int vlen, int flags)
{
	load();
	if (vlen == 0 || !rule_for(fd, msgs[0].msg_hdr.msg_name, msgs[0].msg_hdr.msg_namelen, flags))
		return real_sendmmsg(fd, msgs, vlen, flags);
	/* One at a time through sendmsg above, so each datagram gets its own header. */
	unsigned int i;
	for (i = 0; i < vlen; i++) {
		ssize_t n = sendmsg(fd, &msgs[i].msg_hdr, flags);
		if (n < 0)
			return i ? (int)i : -1;
		msgs[i].msg_len = (unsigned int)n;
	}
	return (int)i;
}

/* libuv sends batches with syscall(SYS_sendmmsg, ...) rather than through libc's sendmmsg. */
long syscall(long number, ...)
{
	load();
	va_list ap;
	va_start(ap, number);
	long a[6];
	for (int i = 0; i < 6; i++)
		a[i] = va_arg(ap, long);
	va_end(ap);
	struct mmsghdr *msgs = (struct mmsghdr *)a[1];
	if (number == SYS_sendmmsg && a[2] > 0 &&
	    rule_for((int)a[0], msgs[0].msg_hdr.msg_name, msgs[0].msg_hdr.msg_namelen, (int)a[3]))
		return sendmmsg((int)a[0], msgs, (unsigned int)a[2], (int)a[3]);
	return real_syscall(number, a[0], a[1], a[2], a[3], a[4], a[5]);
}
