#include <immintrin.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>
#include <sys/syscall.h>
typedef struct { uint8_t palette, start; uint8_t res[14]; uint16_t colsb[16]; uint8_t rows[16]; } cfg_t;
int amx_init(void){ return syscall(SYS_arch_prctl, 0x1023, 18); }
/* c[16][16] fp32 (in/out), a[16][2*kp] bf16 row-major, b[kp][16][2] bf16 (vnni). one TDPBF16PS per call */
void amx_dp(const uint16_t* a, const uint16_t* b, float* c, int kp){
  cfg_t cfg; memset(&cfg,0,sizeof cfg); cfg.palette=1;
  cfg.colsb[0]=64; cfg.rows[0]=16;       /* C */
  cfg.colsb[1]=kp*4; cfg.rows[1]=16;     /* A */
  cfg.colsb[2]=64; cfg.rows[2]=kp;       /* B */
  _tile_loadconfig(&cfg);
  _tile_loadd(0, c, 64);
  _tile_loadd(1, a, kp*4);
  _tile_loadd(2, b, 64);
  _tile_dpbf16ps(0,1,2);
  _tile_stored(0, c, 64);
  _tile_release();
}
