# The duetime image used by docker-compose.yml (for users with a Docker engine).
FROM python:3.11-slim
WORKDIR /app
COPY . /app
RUN pip install --no-cache-dir ".[server]"
ENTRYPOINT []
CMD ["duetime", "--help"]
