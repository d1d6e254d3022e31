# Registers and stack frame of each allreduce kernel as NVRTC compiles kernels/ for sm_90 (the
# H200), read from the cubin's .nv.info attributes (EIATTR_REGCOUNT, EIATTR_FRAME_SIZE): a
# frame in a bandwidth kernel is local memory in its loop. Needs no GPU, only NVRTC. Usage, with
# DIR holding kernels/ (a checkout):
#   LD_LIBRARY_PATH=/tmp/nvrtc/nvidia/cu13/lib python3 frames.py DIR
# The -D values are src/fabric/cuda/layout.rs defines() of the tree it was written for.
import ctypes, sys, struct
lib = ctypes.CDLL("/tmp/nvrtc/nvidia/cu13/lib/libnvrtc.so.13")
def cubin(src, hdr, opts):
    prog = ctypes.c_void_p()
    H=(ctypes.c_char_p*1)(hdr.encode()); N=(ctypes.c_char_p*1)(b"common.cuh")
    lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), b"allreduce.cu", 1, H, N)
    O=(ctypes.c_char_p*len(opts))(*[o.encode() for o in opts])
    r=lib.nvrtcCompileProgram(prog, len(opts), O)
    if r: 
        n=ctypes.c_size_t(); lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
        b=ctypes.create_string_buffer(n.value); lib.nvrtcGetProgramLog(prog,b); print(b.value.decode()[:3000]); sys.exit(1)
    n=ctypes.c_size_t(); lib.nvrtcGetCUBINSize(prog, ctypes.byref(n))
    b=ctypes.create_string_buffer(n.value); lib.nvrtcGetCUBIN(prog,b); return b.raw
root=sys.argv[1]
src=open(root+"/kernels/allreduce.cu").read()
pass
hdr=open(root+"/kernels/common.cuh").read()
defs=["-DMAX_RANKS=16","-DMAX_BLOCKS=256","-DTHREADS=512","-DLL_OFFSET=65536","-DLL_LINE=16","-DLL_THREADS=128","-DLL1_MAX_BYTES=32768","-DLL2_MAX_BYTES=65536"]
data=cubin(src,hdr,["--gpu-architecture=sm_90","--std=c++17"]+defs)
# ELF64 parse
shoff=struct.unpack_from("<Q",data,0x28)[0]; shentsize,shnum,shstrndx=struct.unpack_from("<HHH",data,0x3a)
secs=[]
for i in range(shnum):
    o=shoff+i*shentsize
    name,typ,flags,addr,off,size,link,info,align,entsize=struct.unpack_from("<IIQQQQIIQQ",data,o)
    secs.append((name,typ,off,size,link,entsize))
strtab=secs[shstrndx]
def nm(off,tab): 
    s=data[tab[2]+off:]; return s[:s.index(b"\0")].decode()
symtab=[s for s in secs if s[1]==2][0]
symstr=secs[symtab[4]]
syms=[]
for i in range(symtab[3]//24):
    st_name,info,other,shndx,val,size=struct.unpack_from("<IBBHQQ",data,symtab[2]+i*24)
    syms.append(nm(st_name,symstr))
res={}
for s in secs:
    n=nm(s[0],strtab)
    if n.startswith(".nv.info"):
        d=data[s[2]:s[2]+s[3]]; p=0
        while p<len(d):
            fmt,attr=d[p],d[p+1]; p+=2
            if fmt==4:
                sz=struct.unpack_from("<H",d,p)[0]; p+=2; val=d[p:p+sz]; p+=sz
                if attr in (0x2f,0x11,0x12,0x23) and sz>=8:
                    sym,v=struct.unpack_from("<II",val,0)
                    res.setdefault(syms[sym],{})[{0x2f:"regs",0x11:"frame",0x12:"minstack",0x23:"maxstack"}[attr]]=v
            elif fmt==3: p+=2
            elif fmt==2: p+=1
for k in sorted(res): 
    if not k.startswith("$"): print(k,res[k])
