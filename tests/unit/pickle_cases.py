"""Real pickles for tests/unit/test_pickle.c, and what Python says they hold.

usage: pickle_cases.py OUTDIR CASE PROTOCOL

CASE
  plain   pickle.dumps of plain Python values (ints, floats, str, bytes, containers, sets, ...)
  scalars the same without the big containers (a few KB, for cutting at every byte)
  torch   torch.save in the zip format; data.pkl is the archive's data.pkl
  legacy  torch.save in the legacy format; data.pkl is the whole file (several pickles)
  dupkeys dicts and sets whose pickle sets keys Python treats as equal (1, True, 1.0; 0, False,
          -0.0; the same str twice), which no dict Python pickles holds; the value is what
          pickle.loads makes of it

Writes OUTDIR/data.pkl (and OUTDIR/ckpt.pt for torch cases) and prints one line per pickle in
data.pkl:
the byte offset just after its STOP (found by pickletools, which parses without running), a
space, and the value in the canonical form that dump() in test_pickle.c prints for a pk_obj tree.
The value comes from Python itself: the object that was pickled (plain), or what torch.load
returns (torch, legacy), never from the VM under test.

Canonical form: None True False; ints in decimal; floats as f:<16 hex digits of the IEEE bits>;
"str" and b"bytes" with bytes outside printable ASCII, '"' and '\\' as \\xHH (str as UTF-8 with
surrogates passed through); !int beyond 64 bits for an int the VM must refuse; (tuple) [list or set] {key:value,...}; G:<module.name> for a dtype or
storage class; S<n>:<dtype>:<numel> for a storage, n counting storages in order of first
appearance; T(<dtype>,<storage>,<offset>,(<size>),(<stride>),P|-) for a tensor, P marking an
nn.Parameter.
"""
import collections
import io
import os
import pickle
import pickletools
import struct
import sys
import zipfile

torch = None

DTYPES = {  # torch dtype name -> the name test_pickle.c prints (ck_dtype_name)
    'float64': 'F64', 'float32': 'F32', 'float16': 'F16', 'bfloat16': 'BF16', 'int64': 'I64',
    'int32': 'I32', 'int16': 'I16', 'int8': 'I8', 'uint8': 'U8', 'bool': 'BOOL',
    'complex64': 'C64', 'complex128': 'C128',
}


def esc(b):
    return ''.join(chr(c) if 0x20 <= c < 0x7f and c not in (0x22, 0x5c) else '\\x%02x' % c
                   for c in b)


class Dumper:
    def __init__(self):
        self.storages = {}

    def storage(self, cdata, dtype, numel):
        n = self.storages.setdefault(cdata, len(self.storages))
        return 'S%d:%s:%d' % (n, DTYPES[str(dtype).replace('torch.', '')], numel)

    def dump(self, x):
        if x is None or x is True or x is False:
            return repr(x)
        if isinstance(x, int):  # the VM refuses ints beyond 64 bits (the legacy magic number)
            return str(x) if -2**63 <= x < 2**63 else '!int beyond 64 bits'

        if isinstance(x, float):
            return 'f:' + struct.pack('>d', x).hex()
        if isinstance(x, str):
            return '"' + esc(x.encode('utf-8', 'surrogatepass')) + '"'
        if isinstance(x, (bytes, bytearray)):
            return 'b"' + esc(x) + '"'
        if torch is not None:
            if isinstance(x, torch.Tensor):
                st = x.storage()
                return 'T(%s,%s,%d,(%s),(%s),%s)' % (
                    DTYPES[str(x.dtype).replace('torch.', '')],
                    self.storage(st._cdata, st.dtype, st.size()), x.storage_offset(),
                    ','.join(map(str, x.shape)), ','.join(map(str, x.stride())),
                    'P' if isinstance(x, torch.nn.Parameter) else '-')
            if isinstance(x, torch.storage.TypedStorage):
                return self.storage(x._cdata, x.dtype, x.size())
            if isinstance(x, torch.dtype):
                return 'G:' + str(x)
            if isinstance(x, torch.device):
                return self.dump(str(x))
        if isinstance(x, tuple):
            return '(' + ','.join(map(self.dump, x)) + ')'
        if isinstance(x, (list, set, frozenset)):
            return '[' + ','.join(map(self.dump, x)) + ']'
        if isinstance(x, dict):
            return '{' + ','.join(self.dump(k) + ':' + self.dump(v) for k, v in x.items()) + '}'
        raise TypeError('no canonical form for %r' % type(x))


def scalars():
    return {
        'ints': [0, 1, -1, 255, 256, 65535, 65536, -2**31, 2**31 - 1, 2**31, -2**31 - 1, 2**40,
                 2**63 - 1, -2**63],
        'floats': [0.0, -0.0, 1.5, -2.25e-300, 1e300, float('inf'), float('-inf'),
                   float('nan'), 0.1],
        'strs': ['', 'ascii', 'ünïcödé', '日本語', '\U0001F600', 'a\nb\\c"d\'e', '\x00\x1a\r'],
        'bytes': [b'', b'\x00\xff\x80abc', bytes(range(256))],
        'consts': (None, True, False),
        'nested': {'a': [1, [2, [3, (4, {'b': None})]]]},
    }


def plain_value(proto):
    shared = [1, 2]
    v = scalars()
    v['strs'].append('\ud800x')  # a lone surrogate: Python pickles str with surrogatepass
    v.update({
        'tuples': ((), (1,), (1, 2), (1, 2, 3), (1, 2, 3, 4)),
        'shared': (shared, shared, [shared]),
        'odict': collections.OrderedDict([('x', 1), ('y', [2])]),
        'big_list': list(range(2500)),                      # APPENDS in batches of 1000
        'big_dict': {i: str(i) for i in range(1500)},       # SETITEMS in batches of 1000
        1: 'int key', (1, 'a'): 'tuple key', None: 'None key', 2.5: 'float key',
    })
    if proto >= 4:  # sets have opcodes from protocol 4; before, they are builtins.set calls
        v['sets'] = [set(), {1, 2, 3}, frozenset(), frozenset({'a'})]
    if proto >= 5:
        v['bytearray'] = bytearray(b'xyz')
    return v


def torch_value():
    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 2)
    base = torch.arange(24, dtype=torch.float32)
    dtypes = [getattr(torch, name) for name in DTYPES]
    v = scalars()
    v.update({
        'model': lin.state_dict(),                          # OrderedDict with _metadata
        'sub': {'lin': lin.state_dict(keep_vars=True)},     # Parameters on the same storages
        'param': torch.nn.Parameter(torch.ones(2, 2)),
        'frozen': torch.nn.Parameter(torch.zeros(3), requires_grad=False),
        'view': base[2:14].view(3, 4),                      # storage offset 2, shared
        'base': base,
        'transposed': torch.ones(3, 4).t(),
        'scalar': torch.tensor(3.5),
        'empty': torch.zeros(0, 5),
        'dtypes': {str(d): torch.zeros(2, dtype=d) for d in dtypes},
        'storage': base.storage(),
        'size': torch.Size([2, 3]),
        'dtype': torch.float16,
        'device': torch.device('cuda', 0),
        'cpu': torch.device('cpu'),
        'epoch': 7,
    })
    return v


class Pairs(list):
    """A dict given as the (key, value) pairs it is set from, in order, equal keys and all."""


class MarkedPairs(Pairs):
    """The same, pickled as MARK key value ... DICT rather than SETITEMS."""


class Members(list):
    """A set given as the members added to it, in order, equal ones and all."""


class FrozenMembers(Members):
    """The same, as a frozenset."""


class PairsOrderedDict:
    """OrderedDict(pairs), pickled as that call (REDUCE) on the list of pairs."""

    def __init__(self, pairs):
        self.pairs = pairs

    def __reduce__(self):
        return collections.OrderedDict, (self.pairs,)


class DupPickler(pickle._Pickler):
    """Python's pickler, which also writes Pairs and Members with their repeats."""
    dispatch = pickle._Pickler.dispatch.copy()

    def save_pairs(self, obj):
        marked = isinstance(obj, MarkedPairs)
        self.write(pickle.MARK if marked else pickle.EMPTY_DICT if self.bin
                   else pickle.MARK + pickle.DICT)
        if marked:
            for k, v in obj:
                self.save(k)
                self.save(v)
            self.write(pickle.DICT)
        self.memoize(obj)
        for i in range(0, 0 if marked else len(obj), 1000):  # batches, as Python's own
            batch = obj[i:i + 1000]
            if self.bin:
                self.write(pickle.MARK)
            for k, v in batch:
                self.save(k)
                self.save(v)
                if not self.bin:
                    self.write(pickle.SETITEM)
            if self.bin:
                self.write(pickle.SETITEMS)

    def save_members(self, obj):
        frozen = isinstance(obj, FrozenMembers)
        self.write(pickle.MARK if frozen else pickle.EMPTY_SET + pickle.MARK)
        for m in obj:
            self.save(m)
        self.write(pickle.FROZENSET if frozen else pickle.ADDITEMS)
        self.memoize(obj)

    dispatch[Pairs] = dispatch[MarkedPairs] = save_pairs
    dispatch[Members] = dispatch[FrozenMembers] = save_members


def dupkeys_value(proto):
    nan = float('nan')
    equal = [(1, 'a'), (True, 'b'), (1.0, 'c'), (2, 'd'), (0, 'e'), (False, 'f'), (-0.0, 'g'),
             (0.0, 'h'), ('s', 1), ('s', [2]), (b's', 3), (None, 4), (None, 5), (2.0, 'i'),
             (2.5, 'j'), (nan, 6), (nan, 7), (float('nan'), 8), (1e300, 9), (1e300, 10),
             (2**53, 'k'), (float(2**53), 'l'), (2**53 + 1, 'm'), (2**63 - 1, 'n'),
             (float(2**63), 'o'), (-2**63, 'p'), (float(-2**63), 'q'), (-1, 'r'), (-1.0, 's'),
             (-1.5, 't'), (-1.5, 'u'), ('', 'v'), ('', 'w'), ('ü', 'x'), ('ü', 'y')]
    nested = Pairs([('deep', {'x': {'y': [1, 2]}}), ('deep', 0), ('other', 1)])
    # Past KEY_SCAN keys, where the VM looks keys up in a table: ints, floats and bools in turn.
    many = Pairs((k if i % 3 == 0 else float(k) if i % 3 == 1 else bool(k) if k < 2 else str(k),
                  i) for i, k in enumerate([i % 700 for i in range(2500)]))
    v = Pairs([('equal', Pairs(equal)), ('marked', MarkedPairs(equal)), ('nested', nested),
               ('many', many), ('odict', PairsOrderedDict(equal)), ('equal', 'last')])
    # Sets have opcodes from protocol 4. Python lists a set in hash order, which for small ints
    # is their order, so the members are small ints, in order, and numbers equal to them.
    if proto >= 4:
        v.append(('set', Members([1, True, 1.0, 2, 2.0, 3, 3])))
        v.append(('frozenset', FrozenMembers([0, False, -0.0, 4, 4.0])))
        v.append(('bigset', Members([i % 100 for i in range(1000)] + [1.0, True])))
    return v


def stop_offsets(data, n):
    """The offsets just after the STOP of each of the first n pickles in data."""
    f, out = io.BytesIO(data), []
    for _ in range(n):
        for _ in pickletools.genops(f):
            pass
        out.append(f.tell())
    return out


def main():
    global torch
    outdir, case, proto = sys.argv[1], sys.argv[2], int(sys.argv[3])
    lines = []
    if case == 'dupkeys':
        buf = io.BytesIO()
        DupPickler(buf, protocol=proto).dump(dupkeys_value(proto))
        data = buf.getvalue()
        lines.append('%d %s' % (len(data), Dumper().dump(pickle.loads(data))))
    elif case in ('plain', 'scalars'):
        value = plain_value(proto) if case == 'plain' else scalars()
        data = pickle.dumps(value, protocol=proto)
        lines.append('%d %s' % (len(data), Dumper().dump(value)))
    else:
        import torch as t
        torch = t
        path = os.path.join(outdir, 'ckpt.pt')
        torch.save(torch_value(), path, pickle_protocol=proto,
                   _use_new_zipfile_serialization=case == 'torch')
        loaded = Dumper().dump(torch.load(path))
        if case == 'torch':
            with zipfile.ZipFile(path) as z:  # the top folder is named after the file
                data = z.read([n for n in z.namelist() if n.endswith('/data.pkl')][0])
            lines.append('%d %s' % (len(data), loaded))
        else:
            with open(path, 'rb') as f:
                whole = f.read()
            # magic number, protocol version, sys_info, the objects, the storage keys; then
            # the storages' bytes, which are no pickle.
            offs = stop_offsets(whole, 5)
            data = whole
            begin = [0] + offs[:4]
            for i, end in enumerate(offs):
                value = loaded if i == 3 else Dumper().dump(pickle.loads(whole[begin[i]:end]))
                lines.append('%d %s' % (end, value))
    with open(os.path.join(outdir, 'data.pkl'), 'wb') as f:
        f.write(data)
    print('\n'.join(lines))


if __name__ == '__main__':
    main()
