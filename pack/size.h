/* size.h — sizes as people write them, for options (ckpt --buffer-size and --max-shard-size,
 * ckptfs -o cache_mem).
 *
 * Contract: parse_size accepts digits, then optionally K, M or G, KiB, MiB or GiB (also Ki, Mi,
 * Gi; any case), binary; KB, MB, GB binary too, or decimal with decimal_b, as save_pretrained
 * reads them (huggingface_hub's convert_file_size_to_int). It returns 0 when s is not one, or
 * is 0, or overflows.
 */
#ifndef CK_SIZE_H
#define CK_SIZE_H

#include <stdint.h>

uint64_t parse_size(const char *s, int decimal_b);

#endif
