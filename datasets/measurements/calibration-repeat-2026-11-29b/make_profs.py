import pickle, sys
if __name__ == "__main__":
    import distlab as dl
    profs = {}
    for name, opts in [("mlp", {}), ("convnet", {}), ("transformer_lm", dict(vocab_size=1024, d_model=64, layers=2, heads=4, seq_len=32)), ("wide_deep", {})]:
        profs[name] = dl.profile(dl.zoo.get(name, **opts), batch_size=16)
    pickle.dump(profs, open(sys.argv[1], "wb"))
