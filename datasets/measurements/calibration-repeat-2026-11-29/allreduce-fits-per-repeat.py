import time, warnings
import numpy as np
if __name__ == "__main__":
    import distlab as dl
    import distlab.costmodel.calibrate as K
    orig = K.fit_alpha_beta
    def fab(world, nbytes, seconds, coll):
        a, b, e = orig(world, nbytes, seconds, coll)
        if coll == "allreduce":
            pts = " ".join(f"{int(n)>>10}K:{s*1e3:.2f}" for n, s in zip(nbytes, seconds))
            print(f"{coll}: {pts} -> alpha {a*1e6:.0f}us, 4MiB pred {(a + (4<<20)*b*1)*1e3:.2f}ms (b-term factor ignored) err {e:.2f}", flush=True)
        return a, b, e
    K.fit_alpha_beta = fab
    import distlab.calibration.measure as M
    lab = dl.Lab(workers=2)
    try:
        for i in range(2):
            M.measure_links(lab.cluster, repeats=4)
    finally:
        lab.close()
