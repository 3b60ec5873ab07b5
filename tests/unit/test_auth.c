/* Unit tests for net/auth's handshake MACs: the exact bytes of the hello
 * and welcome MACs (HMAC-SHA256 of label || nonce || nonce || decimal
 * rank || purpose), computed independently with Python's hmac module, so
 * that a change to the message layout, which would split old and new
 * nodes, fails here; and the inputs each MAC refuses. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "net/auth.h"

static const char KEY[] = "0123456789abcdef-secret";

static void nonces(uint8_t ns[AUTH_NONCE_LEN], uint8_t nc[AUTH_NONCE_LEN])
{
	for (unsigned i = 0; i < AUTH_NONCE_LEN; i++) {
		ns[i] = (uint8_t)i;
		nc[i] = (uint8_t)(100 + i);
	}
}

static void assert_mac_hex(const uint8_t mac[AUTH_MAC_LEN], const char *hex)
{
	char got[2 * AUTH_MAC_LEN + 1];

	for (unsigned i = 0; i < AUTH_MAC_LEN; i++)
		snprintf(got + 2 * i, 3, "%02x", mac[i]);
	assert_string_equal(got, hex);
}

static void test_exact_macs(void **state)
{
	static struct net_auth a;
	uint8_t ns[AUTH_NONCE_LEN], nc[AUTH_NONCE_LEN], mac[AUTH_MAC_LEN];

	(void)state;
	nonces(ns, nc);
	assert_int_equal(auth_set_secret(&a, KEY, strlen(KEY)), 0);
	assert_int_equal(auth_hello_mac(&a, ns, nc, 7, "control", mac), 0);
	assert_mac_hex(mac, "27cf7a1690d7406a20cd3162831f987e0eae959e15f232eb05ba537efcc938a0");
	assert_int_equal(auth_hello_mac(&a, ns, nc, AUTH_RANK_TOOL, "data", mac), 0);
	assert_mac_hex(mac, "731be508316a8127ca3e9ceb31ca18936be07916aaa0d1ee90aa9af94c14e603");
	assert_int_equal(auth_welcome_mac(&a, nc, ns, AUTH_RANK_MAX, mac), 0);
	assert_mac_hex(mac, "dc5f526ca0c196814180e498c236807c3eb03b8d6aee67f32c2719c1008ad6ef");
	auth_clear(&a);
}

static void test_refused(void **state)
{
	static struct net_auth a, none;
	uint8_t ns[AUTH_NONCE_LEN], nc[AUTH_NONCE_LEN], mac[AUTH_MAC_LEN];

	(void)state;
	nonces(ns, nc);
	assert_int_equal(auth_set_secret(&a, KEY, strlen(KEY)), 0);
	assert_int_equal(auth_hello_mac(&a, ns, nc, 1, "other", mac), -EINVAL);
	assert_int_equal(auth_hello_mac(&a, ns, nc, 1, NULL, mac), -EINVAL);
	assert_int_equal(auth_hello_mac(&a, ns, nc, AUTH_RANK_MAX + 1, "data", mac), -EINVAL);
	assert_int_equal(auth_hello_mac(&a, ns, nc, -2, "data", mac), -EINVAL);
	assert_int_equal(auth_welcome_mac(&a, nc, ns, AUTH_RANK_MAX + 1, mac), -EINVAL);
	/* no secret: no MAC */
	assert_int_equal(auth_hello_mac(&none, ns, nc, 1, "data", mac), -EINVAL);
	assert_int_equal(auth_welcome_mac(&none, nc, ns, 1, mac), -EINVAL);
	auth_clear(&a);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_exact_macs),
		cmocka_unit_test(test_refused),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
